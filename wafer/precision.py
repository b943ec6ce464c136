"""Precision optimization levels (POL): what a step computes in, level by level.

| level | matmul / convolution operands | their results | everything else |
| --- | --- | --- | --- |
| 0 | float32 | float32 | float32 |
| 1 (default) | rounded to bfloat16 | accumulated and kept in float32 | float32 |
| 2 | rounded to bfloat16 | rounded to bfloat16 | float32 |

At every level weights, optimizer state, gradients as stored, reductions (sums, means,
softmax, normalisation statistics) and elementwise math stay float32; only float32
products are affected. Level 0 equals eager PyTorch on the CPU.
"""
import jax.numpy as jnp

LEVELS = {
    0: {"operands": None, "result": None},
    1: {"operands": jnp.bfloat16, "result": None},
    2: {"operands": jnp.bfloat16, "result": jnp.bfloat16},
}


def matmul_dtypes(level: int) -> dict:
    """{"operands": dtype or None, "result": dtype or None} of optimization level `level`."""
    if level not in LEVELS:
        raise ValueError(f"precision optimization level must be 0, 1 or 2, got {level!r}")
    return LEVELS[level]
