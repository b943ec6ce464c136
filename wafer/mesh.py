"""The emulated wafer: a grid of rows x columns per system, times the number of systems,
laid over whatever JAX devices exist."""
import itertools
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


def box_mesh(mesh: Mesh, systems, shape) -> Mesh:
    """The mesh a user's mesh of boxes gives over the emulated wafer `mesh`: one axis per
    axis of the boxes' array ("box0", "box1", ... of sizes `shape`), then each system's
    "rows" and "cols". `systems` lists, in row-major order of `shape`, the system each box
    is. A program has one order of devices, so the boxes must hold every system of `mesh`
    once, in csx_id order along some order of their axes (a transposed array of boxes is
    laid out by naming the device grid's axes in that order)."""
    systems, shape = [int(s) for s in systems], tuple(int(n) for n in shape)
    count = mesh.shape["systems"]
    if sorted(systems) != list(range(count)):
        raise ValueError(
            f"a mesh of boxes on this cluster must hold each of its {count} systems once "
            f"(csx_id 0 to {count - 1}; their number is the cluster config's num_csx); "
            f"got csx_ids {systems}")
    if math.prod(shape) != len(systems):
        raise ValueError(f"{len(systems)} boxes do not fill a mesh of shape {shape}")
    ids = np.array(systems).reshape(shape)
    for order in itertools.permutations(range(len(shape))):
        if list(ids.transpose(order).flat) == list(range(count)):
            break
    else:
        raise ValueError(
            f"boxes of csx_ids {ids.tolist()} are not in csx_id order along any order of the "
            f"mesh's axes; every program here runs its devices in one order, so arrange the "
            f"boxes by csx_id")
    grid = mesh.devices.reshape(*(shape[a] for a in order), mesh.shape["rows"], mesh.shape["cols"])
    return Mesh(grid, tuple(f"box{a}" for a in order) + AXES[1:])
