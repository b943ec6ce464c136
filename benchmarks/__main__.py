"""The benchmark suite: every workload against its peers, measured in one run.

    python -m benchmarks [--quick] [--workloads a,b] [--peers a,b] [--steps N] [--repeats R]
                         [--no-write]

Workloads (benchmarks/workloads): mlp-tiny, gpt-small, transformer-lm and cnn train on the
CPU against eager PyTorch, torch.compile and the model written by hand in JAX
(benchmarks/peers.py), each in a fresh process (benchmarks/harness.py); first-step times
the 4-layer GPT's first step with a cold and a warm compile_dir (benchmarks/first_step.py);
executor times the DataExecutor loop against a bare loop over the same batches;
peak-memory reads each peer's peak host memory over 3 AdamW steps of a 153M-parameter GPT
(--quick: width 256, 2 layers) and bert-first-step times a tiny transformers BERT
classifier's first step (benchmarks/peak_memory.py). torchax is not run: the project does
not install it.

Each timed figure is the median over repeated timed passes after a warm-up pass, with the
spread (min-max) over the passes. The physical floor of a training workload is its FLOPs
per step (forward and backward, counted from the shapes by PyTorch's FlopCounterMode) over
this machine's float32 matmul rate, measured in the same run (a jitted 2048x2048 jnp.dot).
Prints the tables and writes them to docs/benchmarks.md (section "suite") unless
--no-write.
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import psutil

from benchmarks import first_step, peak_memory, workloads
from benchmarks._report import steal_since, write_section
from benchmarks.harness import MARK
from benchmarks.peers import ORDER, TITLES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES = {"first-step": {"full": (1, 3), "quick": (1, 1)}}
# The executor workload runs the smallest step, where its cost shows most, and gpt-small's.
EXECUTOR_SIZES = {"mlp-tiny": {"full": (100, 45), "quick": (20, 3)},
                  "gpt-small": {"full": (10, 9), "quick": (2, 2)}}
MATMUL_N = 2048


def machine() -> str:
    import jax
    import torch
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f
                         if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (f"{model}, {os.cpu_count()} cores (load average {load} at the start), "
            f"Python {platform.python_version()}, torch {torch.__version__}, "
            f"jax {jax.__version__}")


def matmul_rate(repeats: int):
    """(median, min, max) GFLOP/s of a jitted float32 n x n matmul on this machine."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    rng = np.random.default_rng(0)
    a, b = (jnp.asarray(rng.standard_normal((MATMUL_N, MATMUL_N), np.float32)) for _ in "ab")
    dot = jax.jit(jnp.dot)
    dot(a, b).block_until_ready()
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        dot(a, b).block_until_ready()
        rates.append(2 * MATMUL_N ** 3 / (time.perf_counter() - start) / 1e9)
    return statistics.median(rates), min(rates), max(rates)


def in_subprocess(name, steps, repeats, peers, extra=()):
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}
    cmd = [sys.executable, "-m", "benchmarks.harness", name, "--steps", str(steps),
           "--repeats", str(repeats), "--peers", ",".join(peers), *extra]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
    return {"workload": name, "error": f"exit status {proc.returncode}: {tail[0][:300]}"}


def executor_runs(mode, steps, repeats):
    """The executor workload for each model of EXECUTOR_SIZES, each in a fresh process;
    `steps` and `repeats` override the sizes when given."""
    runs = []
    for model, sizes in EXECUTOR_SIZES.items():
        n, r = sizes[mode]
        runs.append(in_subprocess("executor", steps or n, repeats or r, (),
                                  ("--model", model)))
    return {"workload": "executor", "models": runs}


def _own(peers):
    """The peers of `peak_memory` among `peers` (it has no hand-written JAX peer)."""
    return [p for p in peers if p in peak_memory.PEERS]


def first_steps(repeats):
    runs = [first_step.cold_and_warm() for _ in range(repeats)]
    return {"workload": "first-step", "repeats": repeats,
            "runs": {run: [r[run] for r in runs] for run in first_step.RUNS}}


# formatting ------------------------------------------------------------------------------
def _ms(x):
    return f"{x:.3f}" if x < 1 else f"{x:.2f}" if x < 100 else f"{x:.0f}"


def _stats(values):
    return statistics.median(values), min(values), max(values)


def training_table(results, rate) -> str:
    lines = ["| workload | peer | ms/step (median) | spread (min-max) | cstorch speed vs peer "
             "| share of the floor | first step (s) | loss after the run |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in results:
        name = r["workload"]
        if "error" in r:
            lines.append(f"| {name} | all | failed: {r['error']} | | | | | |")
            continue
        floor_ms = r["flops"] / (rate * 1e9) * 1e3
        peers = r["peers"]
        ours = peers.get("cstorch", {})
        lines.append(f"| {name} | physical floor: {r['flops'] / 1e9:.3g} GFLOP/step at "
                     f"{rate:.0f} GFLOP/s | {_ms(floor_ms)} | | | 100% | | |")
        for peer in ORDER:
            if peer not in peers:
                continue
            p = peers[peer]
            if "error" in p:
                lines.append(f"| {name} | {TITLES[peer]} | failed: {p['error']} | | | | | |")
                continue
            med, lo, hi = _stats(p["ms"])
            # Paired pass by pass, so that the machine's drift between passes cancels.
            pairs = [a / b for a, b in zip(p["ms"], ours.get("ms") or ())]
            ratio = (f"{statistics.median(pairs):.2f}x ({min(pairs):.2f}-{max(pairs):.2f})"
                     if pairs else "")
            lines.append(f"| {name} | {TITLES[peer]} | {_ms(med)} | {_ms(lo)}-{_ms(hi)} | "
                         f"{ratio} | {100 * floor_ms / med:.1f}% | {p['first_step_s']:.2f} | "
                         f"{'' if p.get('loss') is None else format(p['loss'], '.6f')} |")
        lines.append(f"| {name} | {TITLES['torchax']} | not run: project rule | | | | | |")
    return "\n".join(lines)


def executor_table(r) -> str:
    names = {"bare": "bare Python loop over the batches, the same traced step",
             "executor": "DataExecutor (prefetch=False)",
             "executor-prefetch": "DataExecutor (prefetch=True)"}
    lines = ["| step | loop | passes x steps | ms/step (median) | spread (min-max) "
             "| overhead vs bare loop: median of the passes' ratios (min-max) "
             "| µs/step over the bare loop (median of the passes' differences) |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: |"]
    for m in r["models"]:
        if "error" in m:
            lines.append(f"| {m.get('model', '?')} | failed: {m['error']} | | | | | |")
            continue
        bare = m["loops"]["bare"]["ms"]
        for key, title in names.items():
            ms = m["loops"][key]["ms"]
            med, lo, hi = _stats(ms)
            # The loops take turns pass by pass: a ratio within a pass cancels the machine's
            # slow spells, which move single passes by more than the overhead measured.
            ratios = [t / b for t, b in zip(ms, bare)]
            extra = statistics.median(1e3 * (t - b) for t, b in zip(ms, bare))
            lines.append(f"| {m['model']}: {m['title']}, loss read every step | {title} | "
                         f"{m['repeats']} x {m['steps']} | {_ms(med)} | {_ms(lo)}-{_ms(hi)} | "
                         f"{100 * (statistics.median(ratios) - 1):+.1f}% "
                         f"({100 * (min(ratios) - 1):+.1f} to {100 * (max(ratios) - 1):+.1f}%) | "
                         f"{extra:+.1f} |")
    return "\n".join(lines)


def first_step_table(r, gpt) -> str:
    lines = ["| gpt-small, first step | seconds (median) | spread (min-max) "
             "| of which XLA compile or cache read (s) | step programs compiled | vs cold |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    if "error" in r:
        return f"first-step: failed: {r['error']}"
    cold = statistics.median([x["first_step_s"] for x in r["runs"][first_step.RUNS[0]]])
    phases = ["| cstorch first step, fresh process | seconds | "
              + " | ".join(first_step.PHASES.values()) + " | the rest |",
              "| --- " * (len(first_step.PHASES) + 3) + "|"]
    for run, xs in r["runs"].items():
        med, lo, hi = _stats([x["first_step_s"] for x in xs])
        xla = statistics.median([x["xla_s"] for x in xs])
        compiled = "/".join(str(x["compiled"]) for x in xs)
        lines.append(f"| cstorch, CSX backend, fresh process, {run} | {med:.2f} | {lo:.2f}-{hi:.2f}"
                     f" | {xla:.2f} | {compiled} | {med / cold:.2f}x |")
        if all(k in xs[0] for k in first_step.PHASES):   # medians of each part
            parts = {k: statistics.median([x[k] for x in xs]) for k in first_step.PHASES}
            phases.append(f"| {run} | {med:.2f} | "
                          + " | ".join(f"{v:.2f}" for v in parts.values())
                          + f" | {med - sum(parts.values()):.2f} |")
    if gpt and "peers" in gpt:   # the warm-up of the gpt-small workload, one process
        for peer in ORDER:
            p = gpt["peers"].get(peer, {})
            if "first_step_s" in p:
                s = p["first_step_s"]
                lines.append(f"| {TITLES[peer]}, in the gpt-small process | {s:.2f} | | | | "
                             f"{s / cold:.2f}x |")
    if len(phases) > 2:
        lines += ["", "Where the cstorch first step goes (medians, seconds; `the rest` is running "
                  "the step, placing the state and Python around them):", ""] + phases
    return "\n".join(lines)


def report(command, where, results, rate, quick) -> str:
    by_name = {r["workload"]: r for r in results}
    training = [by_name[w] for w in workloads.TRAINING if w in by_name]
    parts = ["### The last run", "",
             f"`{command}` on {where}."
             + (" Quick mode: few steps and passes, a smoke test, not a measurement." if quick
                else ""), ""]
    parts += ["Medians over the timed passes after a warm-up pass; the spread is min-max over the "
              "passes. The loss is read on the host after every step. The peers take turns pass "
              "by pass, in an order shuffled for each pass. `cstorch speed vs peer` is the "
              "median over the passes of the peer's ms/step over cstorch's in the same pass, "
              "with their min-max (above 1: cstorch is faster). The physical floor "
              "is the workload's FLOPs per step (forward and backward, counted from the shapes by "
              "PyTorch's FlopCounterMode) over this machine's float32 matmul rate, "
              f"{rate[0]:.0f} GFLOP/s (median; {rate[1]:.0f}-{rate[2]:.0f}) for a jitted "
              f"{MATMUL_N}x{MATMUL_N} jnp.dot measured in the same run; `share of the floor` is "
              "floor / ms per step. All peers start from the same values and train on the same "
              "batches the same number of steps (hundreds to thousands: every pass continues "
              "the training). The last loss shows that each peer trained; it is not a check "
              "that they compute the same thing: over that many steps float32 rounding "
              "differences grow, as the eager and torch.compile rows show, and "
              "`cstorch.optim.AdamW` follows the Cerebras package (eps added to sqrt(v), the "
              "bias correction folded into the step size), not torch's formula. Equality over "
              "a few steps is what the test suite checks.",
              ""]
    if training:
        parts += ["Training step:", ""]
        parts += [f"- {r['workload']}: {r.get('title', '')}"
                  + (f" ({r['params']:,} parameters)" if "params" in r else "")
                  + (f"; {r['steps']} steps per pass, {r['repeats']} timed passes"
                     if "steps" in r else "")
                  + (f"; {r['steal']}" if "steal" in r else "") for r in training]
        parts += ["", training_table(training, rate[0]), ""]
    if "first-step" in by_name:
        r = by_name["first-step"]
        parts += [f"First step of gpt-small: {r.get('repeats', '?')} pair(s) of fresh processes "
                  "on the CSX backend sharing a new compile_dir each (benchmarks/first_step.py); "
                  "the in-process rows are the first step of each peer in the gpt-small "
                  "workload (capture and compilation included, imports excluded)"
                  + (f"; {r['steal']}" if "steal" in r else "") + ".", "",
                  first_step_table(r, by_name.get("gpt-small")), ""]
    if "peak-memory" in by_name:
        r = by_name["peak-memory"]
        parts += [f"Peak host memory (benchmarks/peak_memory.py; {r.get('steal', '')}):", "",
                  peak_memory.memory_table(r["peers"], r["mode"]), ""]
    if "bert-first-step" in by_name:
        r = by_name["bert-first-step"]
        parts += [f"Tiny BERT's first step (benchmarks/peak_memory.py; {r.get('steal', '')}):",
                  "", peak_memory.bert_table(r["peers"]), ""]
    if "executor" in by_name:
        r = by_name["executor"]
        parts += ["DataExecutor overhead: each model in a fresh process (benchmarks/harness.py), "
                  "the loops taking turns pass by pass in a shuffled order"
                  + (f"; {r['steal']}" if "steal" in r else "") + ".", "",
                  executor_table(r), ""]
    return "\n".join(parts).rstrip() + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="few steps and passes (smoke test)")
    parser.add_argument("--workloads", default=",".join(workloads.ALL),
                        help=f"comma-separated, from {','.join(workloads.ALL)}")
    parser.add_argument("--peers", default=",".join(ORDER),
                        help=f"training peers, comma-separated, from {','.join(ORDER)}")
    parser.add_argument("--steps", type=int,
                        help="steps per pass of the training and executor workloads")
    parser.add_argument("--repeats", type=int,
                        help="timed passes of the training and executor workloads")
    parser.add_argument("--no-write", action="store_true", help="do not write docs/benchmarks.md")
    args = parser.parse_args(argv)
    chosen = [w for w in args.workloads.split(",") if w]
    peers = [p for p in args.peers.split(",") if p]
    unknown = sorted(set(chosen) - set(workloads.ALL)) + sorted(set(peers) - set(ORDER))
    if unknown:
        parser.error(f"unknown workload or peer: {', '.join(unknown)}")
    mode = "quick" if args.quick else "full"
    command = "python -m benchmarks" + "".join(f" {a}" for a in (argv or sys.argv[1:]))
    where = f"{machine()}, {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}"
    suite_cpu = psutil.cpu_times()
    rate = matmul_rate(3 if args.quick else 10)
    print(f"matmul rate: {rate[0]:.1f} GFLOP/s (min {rate[1]:.1f}, max {rate[2]:.1f})", flush=True)
    results = []
    for name in workloads.ALL:   # a fixed order: gpt-small before first-step
        if name not in chosen:
            continue
        if name == "first-step":
            steps, repeats = SIZES[name][mode]
        elif name in workloads.TRAINING:
            steps, repeats = workloads.load(name).SIZES[mode]
            steps, repeats = args.steps or steps, args.repeats or repeats
        start, cpu = time.perf_counter(), psutil.cpu_times()
        print(f"{name}: running ...", flush=True)
        if name == "first-step":
            try:
                results.append(first_steps(repeats))
            except Exception as e:  # noqa: BLE001 - reported in the table
                results.append({"workload": name, "error": f"{type(e).__name__}: {e}"[:300]})
        elif name == "executor":
            results.append(executor_runs(mode, args.steps, args.repeats))
        elif name == "peak-memory":   # one peer at a time: the full size takes GBs each
            results.append({"workload": name, "mode": mode,
                            "peers": peak_memory.peak_memory(mode, _own(peers))})
        elif name == "bert-first-step":
            results.append({"workload": name,
                            "peers": peak_memory.bert_first_step(_own(peers))})
        else:
            results.append(in_subprocess(name, steps, repeats, peers))
        results[-1]["steal"] = steal_since(cpu)
        print(f"{name}: done in {time.perf_counter() - start:.0f} s ({results[-1]['steal']})",
              flush=True)
    where += f"; over the whole run, {steal_since(suite_cpu)}"
    text = report(command, where, results, rate, args.quick)
    print(text)
    if not args.no_write:
        write_section("suite", text)
        print(f"written to {os.path.relpath(os.path.join(ROOT, 'docs', 'benchmarks.md'))}")


if __name__ == "__main__":
    main()
