"""First-step latency of the 4-layer GPT with a cold and a warm `compile_dir`.

Runs the same script twice, in two fresh processes sharing one new compile_dir, and
prints for each: the first step's wall time, the part spent in XLA compilation (or in
reading the persistent cache), and how many step programs XLA compiled. Run:
python -m benchmarks.first_step
"""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = r"""
import json, sys, time
import torch
import cerebras.pytorch as cstorch
import bridge, wafer
from examples.train_gpt import TinyGPT, next_token_loss
backend = cstorch.backend("CSX", compile_dir=sys.argv[1], artifact_dir=sys.argv[1] + ".logs")
torch.manual_seed(0)
model = TinyGPT(vocab=1000, dim=256, heads=4, layers=4, block=128)
compiled = cstorch.compile(model, backend)
optimizer = cstorch.optim.AdamW(model.parameters(), lr=1e-3)

@cstorch.trace
def step(tokens):
    loss = next_token_loss(compiled, tokens)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss

tokens = torch.randint(0, 1000, (8, 129), generator=torch.Generator().manual_seed(1))
start = time.perf_counter()
loss = float(step(tokens))
first = time.perf_counter() - start
start = time.perf_counter()
float(step(tokens))
second = time.perf_counter() - start
c, w = bridge.capture_stats, wafer.compile_stats
print(json.dumps({"first_step_s": first, "second_step_s": second, "xla_s": w.seconds,
                  "compiled": w.compiled, "loss": loss, "tracing_s": c.tracing_seconds,
                  "captures": step.captures, "warm_starts": step.warm_starts,
                  "lowering_s": w.lowering_seconds,
                  "artifacts_s": w.artifact_seconds, "loading_s": w.loading_seconds}))
"""


RUNS = ("cold compile_dir", "warm compile_dir")


def cold_and_warm():
    """{run: result} for one new compile_dir: a cold then a warm fresh process, each
    result {"first_step_s", "xla_s", "compiled", "loss"}."""
    cache = tempfile.mkdtemp(prefix="cstorch-compile-dir-")
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}
    results = {}
    for run in RUNS:
        proc = subprocess.run([sys.executable, "-c", SCRIPT, cache], env=env, cwd=ROOT,
                              capture_output=True, text=True)
        if proc.returncode:
            raise RuntimeError(f"the {run} process failed:\n{proc.stderr[-2000:]}")
        results[run] = json.loads(proc.stdout.strip().splitlines()[-1])
    return results


# The parts of a first step, as the result keys name them.
PHASES = {"tracing_s": "capture: the step on fake tensors, functionalised and decomposed",
          "lowering_s": "JAX tracing and StableHLO lowering",
          "xla_s": "XLA compile or cache read", "artifacts_s": "artifacts written",
          "loading_s": "stored program read (warm start)"}


def main():
    results = cold_and_warm()
    print("| run | first step (s) | " + " | ".join(PHASES.values()) + " | the rest (s) |")
    print("|---" * (len(PHASES) + 3) + "|")
    for run, r in results.items():
        rest = r["first_step_s"] - sum(r[k] for k in PHASES)
        print(f"| {run} | {r['first_step_s']:.2f} | "
              + " | ".join(f"{r[k]:.2f}" for k in PHASES) + f" | {rest:.2f} |")


if __name__ == "__main__":
    main()
