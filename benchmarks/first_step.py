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
import wafer
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
print(json.dumps({"first_step_s": time.perf_counter() - start, "xla_s": wafer.compile_stats.seconds,
                  "compiled": wafer.compile_stats.compiled, "loss": loss}))
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


def main():
    print("| run | first step (s) | of which XLA compile or cache read (s) "
          "| step programs compiled |")
    print("|---|---|---|---|")
    for run, r in cold_and_warm().items():
        print(f"| {run} | {r['first_step_s']:.2f} | {r['xla_s']:.2f} | {r['compiled']} |")


if __name__ == "__main__":
    main()
