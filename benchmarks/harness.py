"""Measure one workload in this process and print the result as one JSON line:

    python -m benchmarks.harness WORKLOAD [--steps N] [--repeats R] [--peers a,b]

`python -m benchmarks` runs each workload this way, in a fresh process of its own. A
training workload's peers (benchmarks/peers.py) run the same batches from the same initial
values: one warm-up pass each (capture and compilation happen there; its first step is
timed on its own), then `repeats` timed passes of `steps` steps, the peers taking turns pass
by pass so that a slow spell of the machine hits them all alike, in an order shuffled
from pass to pass. The loss is read on the host after every step. The `executor` workload
times a workload's traced step (`--model`, default mlp-tiny) under a `DataExecutor` against
a bare Python loop over the same batches.
"""
import argparse
import copy
import json
import random
import time
import traceback

import torch
from torch.utils.flop_counter import FlopCounterMode

from benchmarks import peers as peer_makers
from benchmarks import workloads
from benchmarks.mlp_step import one_pass

MARK = "BENCHMARK-RESULT "
READ_EVERY = 1


def count_flops(workload, model, batch) -> int:
    """FLOPs of one forward and backward pass (matmuls, convolutions, attention), counted
    from the shapes by PyTorch's FlopCounterMode on the eager model."""
    with FlopCounterMode(display=False) as counter:
        workload.loss(model, *batch).backward()
    return counter.get_total_flops()


def _value(loss) -> float:
    return float(loss.detach() if isinstance(loss, torch.Tensor) else loss)


def _error(e: BaseException) -> str:
    first = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {first}"[:300]


def in_turns(runs: dict, repeats: int):
    """The order of each of `repeats` passes: every key of `runs` (read afresh each pass,
    so a peer dropped after a failure drops out) once, shuffled pass by pass. A peer's
    pass can run slower after one peer than after another (their threads and heap); a
    fixed order would charge that to one."""
    shuffle = random.Random(0).shuffle
    for _ in range(repeats):
        order = list(runs)
        shuffle(order)
        yield order


def measure(name: str, steps: int, repeats: int, peers=peer_makers.ORDER) -> dict:
    wl = workloads.load(name)
    base = wl.make_model()
    data = wl.batches(steps)
    result = {"workload": name, "title": wl.TITLE, "steps": steps, "repeats": repeats,
              "params": sum(p.numel() for p in base.parameters()),
              "flops": count_flops(wl, copy.deepcopy(base), data[0]), "peers": {}}
    out = result["peers"]
    runs = {}
    # cstorch first: one backend per process, created before the others allocate.
    for peer in sorted(peers, key=lambda p: p != "cstorch"):
        try:
            runs[peer] = peer_makers.MAKERS[peer](wl, copy.deepcopy(base))
        except Exception as e:  # noqa: BLE001 - a peer that cannot be built is reported
            out[peer] = {"error": _error(e)}
    for peer, run in list(runs.items()):
        try:
            start = time.perf_counter()
            _value(run(*data[0], True))
            out[peer] = {"first_step_s": time.perf_counter() - start, "ms": []}
            one_pass(run, data[1:] or data, READ_EVERY)
        except Exception as e:  # noqa: BLE001 - e.g. torch.compile failing on this machine
            traceback.print_exc()
            out[peer] = {"error": _error(e)}
            del runs[peer]
    last = {}

    def keeping_the_loss(peer, run):
        def step(*args):
            last[peer] = loss = run(*args)
            return loss
        return step
    for order in in_turns(runs, repeats):
        for peer in order:
            run = runs[peer]
            try:
                out[peer]["ms"].append(one_pass(keeping_the_loss(peer, run), data, READ_EVERY))
            except Exception as e:  # noqa: BLE001 - reported in the table
                traceback.print_exc()
                out[peer] = {"error": _error(e)}
                del runs[peer]
    for peer in runs:   # same batches, same number of steps: the losses agree
        out[peer]["loss"] = _value(last[peer]) if peer in last else None
    return result


def measure_executor(steps: int, repeats: int, model: str = "mlp-tiny") -> dict:
    """ms/step of a workload's traced step (loss read every step) in a bare loop over a
    list of batches, and under `DataExecutor` over a `cstorch.utils.data.DataLoader` of
    the same list, without and with prefetching; the loops take turns pass by pass, in an
    order shuffled for each pass, as the training peers do."""
    import cerebras.pytorch as cstorch
    wl = workloads.load(model)
    step = peer_makers.cstorch_step(wl, wl.make_model())
    data = wl.batches(steps)
    loader = cstorch.utils.data.DataLoader(lambda: data)

    def bare():
        start = time.perf_counter()
        for batch in data:
            float(step(*batch))
        return (time.perf_counter() - start) / steps * 1e3

    def executor(prefetch):
        def timed():
            start = time.perf_counter()
            for batch in cstorch.utils.data.DataExecutor(loader, num_steps=steps,
                                                         prefetch=prefetch):
                float(step(*batch))
            return (time.perf_counter() - start) / steps * 1e3
        return timed

    loops = {"bare": bare, "executor": executor(False), "executor-prefetch": executor(True)}
    times = {k: [] for k in loops}
    for loop in loops.values():
        # Warm-up: captures the step (prefetched batches hold device tensors, another key).
        # Gradients are cleared first, so that no program is captured while the last step's
        # gradients are pending: such a program takes them in and unpacks them every call.
        step.optimizer.zero_grad()
        loop()
    for order in in_turns(loops, repeats):
        for k in order:
            times[k].append(loops[k]())
    return {"workload": "executor", "model": model, "title": wl.TITLE, "steps": steps,
            "repeats": repeats, "captures": step.captures,
            "loops": {k: {"ms": v} for k, v in times.items()}}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("workload", choices=tuple(workloads.TRAINING) + ("executor",))
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--repeats", type=int, required=True)
    parser.add_argument("--peers", default=",".join(peer_makers.ORDER))
    parser.add_argument("--model", default="mlp-tiny", choices=tuple(workloads.TRAINING),
                        help="the workload whose step the executor workload runs")
    args = parser.parse_args()
    if args.workload == "executor":
        result = measure_executor(args.steps, args.repeats, args.model)
    else:
        result = measure(args.workload, args.steps, args.repeats,
                         [p for p in args.peers.split(",") if p])
    print(MARK + json.dumps(result), flush=True)


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
