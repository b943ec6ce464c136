"""What the in-program index check costs a training step (`cstorch.backends.csx.debug.
check_indices`, on by default on the CPU backend):

    python -m benchmarks.index_checks [--workloads gpt-small,mlp-tiny] [--steps N] [--repeats R]

One traced step per workload, its programs with the check on and off both compiled (the
setting is part of the program key); passes of `steps` steps alternate between the two in
an order shuffled pass by pass, the loss read on the host after every step (the check is
then read before each loss) and, in a second pair of loops, only after the last step (the
check is read two calls on). Prints ms/step (median over passes) and the median, min and
max over passes of the ratio on/off (the two loops of a pass run close in time).
"""
import argparse
import statistics

from benchmarks import peers as peer_makers
from benchmarks import workloads
from benchmarks.harness import in_turns
from benchmarks.mlp_step import one_pass


def measure(name: str, steps: int, repeats: int) -> dict:
    import cerebras.pytorch as cstorch
    flags = cstorch.backends.csx.debug
    wl = workloads.load(name)
    step = peer_makers.cstorch_step(wl, wl.make_model())
    data = wl.batches(steps)

    def loop(check, every):
        def timed():
            flags.check_indices = check
            try:
                return one_pass(peer_makers.reading(step), data, every)
            finally:
                flags.reset()
        return timed

    loops = {f"{'on' if check else 'off'}, read every {'step' if every == 1 else 'pass'}":
             loop(check, every) for every in (1, steps) for check in (True, False)}
    for run in loops.values():   # warm-up: both programs captured and compiled
        run()
    times = {k: [] for k in loops}
    for order in in_turns(loops, repeats):
        for k in order:
            times[k].append(loops[k]())
    ratios = {read: [on / off for on, off in zip(times[f"on, read every {read}"],
                                               times[f"off, read every {read}"])]
              for read in ("step", "pass")}
    return {"workload": name, "title": wl.TITLE, "captures": step.captures,
            "ms": {k: statistics.median(v) for k, v in times.items()},
            "ratio": {k: (statistics.median(v), min(v), max(v)) for k, v in ratios.items()}}


def main():
    parser = argparse.ArgumentParser(prog="python -m benchmarks.index_checks")
    parser.add_argument("--workloads", default="gpt-small,mlp-tiny")
    parser.add_argument("--steps", type=int, default=None,
                        help="steps per pass (default: 20 for gpt-small, 200 otherwise)")
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    import importlib
    # One backend per workload in this process: each replaces the last.
    importlib.import_module("cstorch.backend")._replacing_allowed = True
    for name in args.workloads.split(","):
        steps = args.steps or (20 if name == "gpt-small" else 200)
        r = measure(name, steps, args.repeats)
        print(f"{name}: {r['title']} ({r['captures']} programs; {steps} steps x "
              f"{args.repeats} passes)")
        for read in ("step", "pass"):
            on, off = (f"on, read every {read}", f"off, read every {read}")
            print(f"  loss read every {read}: check on {r['ms'][on]:.3f} ms/step, off "
                  f"{r['ms'][off]:.3f}; on/off per pass, median {r['ratio'][read][0]:.3f} "
                  f"(min {r['ratio'][read][1]:.3f}, max {r['ratio'][read][2]:.3f})")


if __name__ == "__main__":
    main()
