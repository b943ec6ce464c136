"""The emulated wafer: a grid of rows x columns per system, times the number of systems,
laid over whatever JAX devices exist."""
import math

import jax
import numpy as np
from jax.sharding import Mesh

AXES = ("systems", "rows", "cols")


def _grid(n: int) -> tuple[int, int]:
    """The most square rows x cols factorisation of `n`."""
    rows = int(math.isqrt(n))
    while n % rows:
        rows -= 1
    return rows, n // rows


def make_mesh(devices=None, num_systems: int = 1) -> Mesh:
    """A mesh with axes ("systems", "rows", "cols") over `devices` (default: all)."""
    devices = list(devices if devices is not None else jax.devices())
    if num_systems < 1 or len(devices) % num_systems:
        raise ValueError(
            f"{len(devices)} devices cannot be split into {num_systems} systems; "
            "use a number of systems that divides the device count")
    rows, cols = _grid(len(devices) // num_systems)
    grid = np.array(devices, dtype=object).reshape(num_systems, rows, cols)
    return Mesh(grid, AXES)
