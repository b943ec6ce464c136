"""Host memory of building a model with one large parameter, with and without lazy
initialisation (`cstorch.backends.csx.debug.lazy_initialization`).

Each run is a fresh process on a CSX backend that builds `Linear(n, n)` inside
`with backend.device:` (its own kaiming-uniform init, or that followed by `nn.init.zeros_`)
and compiles it, reading the process's resident set size
(`/proc/self/status`): after start-up (torch, JAX and the backend ready), after building
the model, after `cstorch.compile` has placed the value (waited for, then a garbage
collection), and its peak from the end of start-up to after the
compile (the peak counter is reset once start-up is done). On a CPU-only machine the
devices are this process's memory too, so the compiled value itself (one copy, built by
XLA) is counted after compile in both runs. Run: python -m benchmarks.lazy_init_memory [n]
"""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = r"""
import gc, json, sys
import jax
import torch
import cerebras.pytorch as cstorch

def status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(field)

n, lazy, init = int(sys.argv[1]), sys.argv[2] == "lazy", sys.argv[3]
cstorch.backends.csx.debug.lazy_initialization = lazy
backend = cstorch.backend("CSX", log_initialization=False)
with backend.device:  # start-up: the dispatch machinery and a first tiny JAX program
    warm = torch.nn.Linear(4, 4)
cstorch.compile(warm, backend)
peak_reset = True
try:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM, the peak resident set size
except OSError:
    peak_reset = False
base = status("VmRSS")
torch.manual_seed(0)
with backend.device:
    model = torch.nn.Linear(n, n, bias=False)
    if init == "zeros":
        torch.nn.init.zeros_(model.weight)
built = status("VmRSS")
lazy_param = type(model.weight).__name__ == "LazyInitTensor"
cstorch.compile(model, backend)
jax.block_until_ready(list(backend.state.arrays().values()))  # placing is asynchronous
gc.collect()  # the replaced host parameter may sit in a reference cycle until then
compiled = status("VmRSS")
print(json.dumps({"bytes": n * n * 4, "base": base, "built": built, "compiled": compiled,
                  "peak": status("VmHWM"), "peak_reset": peak_reset, "lazy_param": lazy_param}))
"""


def measure(n: int, lazy: bool, init: str = "kaiming") -> dict:
    """One run in a fresh process; sizes in bytes, relative to the state after start-up.
    `init`: "kaiming" (Linear's own random init) or "zeros" (then `nn.init.zeros_`)."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}
    env.pop("XLA_FLAGS", None)
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(n), "lazy" if lazy else "eager", init],
                         env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    r = json.loads(out.stdout.strip().splitlines()[-1])
    return {"param_bytes": r["bytes"], "lazy_param": r["lazy_param"],
            "after_build": r["built"] - r["base"], "after_compile": r["compiled"] - r["base"],
            "peak": r["peak"] - r["base"] if r["peak_reset"] else None}


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 8192
    mib = 2 ** 20
    print(f"Linear({n}, {n}) weight: {n * n * 4 / mib:.0f} MiB float32")
    print("| init | lazy_initialization | RSS growth after build (MiB) | after compile (MiB) | "
          "peak, build through compile (MiB) |")
    print("|---|---|---|---|---|")
    for init in ("kaiming", "zeros"):
        for lazy in (True, False):
            r = measure(n, lazy, init)
            peak = "n/a" if r["peak"] is None else f"{r['peak'] / mib:.0f}"
            print(f"| {init} | {lazy} | {r['after_build'] / mib:.0f} | "
                  f"{r['after_compile'] / mib:.0f} | {peak} |")


if __name__ == "__main__":
    main()
