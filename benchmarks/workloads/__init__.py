"""The workloads of `python -m benchmarks`: each training workload is a module with

- `TITLE`: one line saying what it trains;
- `SIZES`: {"full": (steps per pass, timed passes), "quick": (...)};
- `OPTIMIZER`: (class name in both `torch.optim` and `cstorch.optim`, keyword arguments);
- `make_model()`: the torch model, seeded; `batches(n)`: n tuples of step arguments;
- `loss(model, *batch)`: the torch loss;
- `jax_init(model)`: (params, buffers), pytrees of arrays from the torch model's values;
- `jax_loss(params, buffers, *batch)`: (loss, new buffers), the same math written in JAX.

`first-step`, `executor`, `peak-memory` and `bert-first-step` are measured by their own
code (benchmarks/first_step.py, benchmarks/harness.py, benchmarks/peak_memory.py).
"""
import importlib

TRAINING = {"mlp-tiny": "mlp_tiny", "gpt-small": "gpt_small", "transformer-lm": "transformer_lm",
            "cnn": "cnn"}
SPECIAL = ("first-step", "executor", "peak-memory", "bert-first-step")
ALL = tuple(TRAINING) + SPECIAL


def load(name: str):
    return importlib.import_module(f"benchmarks.workloads.{TRAINING[name]}")
