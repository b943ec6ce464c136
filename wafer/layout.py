"""Where each array of a step lives on the mesh.

Batches are split over the systems and the wafer's grid where their leading dimension
allows it. State is laid over the grid of every system: a matrix's last two dimensions
over rows and columns (each where it divides), and replicated across systems, as data
parallelism between systems keeps a copy of the weights on each. Vectors and scalars
are replicated. XLA's SPMD partitioner inserts the collectives.
"""
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def batch_sharding(mesh: Mesh, shape) -> NamedSharding:
    """Split the leading (batch) dimension over as many data axes as divide it."""
    if not shape:
        return replicated(mesh)
    axes, ways = [], 1
    for axis in ("systems", "rows", "cols"):
        size = mesh.shape[axis]
        if size > 1 and shape[0] % (ways * size) == 0:
            axes.append(axis)
            ways *= size
    return NamedSharding(mesh, PartitionSpec(tuple(axes) if axes else None))


def state_sharding(mesh: Mesh, shape) -> NamedSharding:
    """The sharding of a parameter or optimizer-state array of `shape`."""
    if len(shape) < 2:
        return replicated(mesh)
    spec = [None] * len(shape)
    for dim, axis in ((-2, "rows"), (-1, "cols")):
        if mesh.shape[axis] > 1 and shape[dim] % mesh.shape[axis] == 0:
            spec[dim] = axis
    return NamedSharding(mesh, PartitionSpec(*spec))


def layout_report(arrays: dict, mesh: Mesh) -> list[dict]:
    """Where each named array lives: its partition over the mesh and the bytes each device
    holds, next to the bytes a replicated copy would take. Arrays may be abstract
    (`jax.ShapeDtypeStruct` with a sharding)."""
    rows = []
    for name, a in arrays.items():
        shape = tuple(a.shape)
        itemsize = np.dtype(a.dtype).itemsize
        sharding = getattr(a, "sharding", None) or replicated(mesh)
        shard = tuple(sharding.shard_shape(shape))
        spec = getattr(sharding, "spec", PartitionSpec())
        rows.append({
            "name": name, "shape": shape, "dtype": str(np.dtype(a.dtype)),
            "partition": str(tuple(spec)) if len(spec) else "replicated",
            "shard_shape": shard,
            "bytes_per_device": int(np.prod(shard, dtype=np.int64)) * itemsize,
            "bytes_replicated": int(np.prod(shape, dtype=np.int64)) * itemsize,
        })
    return rows


def format_layout(rows: list[dict], mesh: Mesh) -> str:
    """The layout report as a text table, with totals per device."""
    header = ("name", "shape", "dtype", "partition", "per device", "replicated")
    body = [(r["name"], "x".join(map(str, r["shape"])) or "scalar", r["dtype"], r["partition"],
             _bytes(r["bytes_per_device"]), _bytes(r["bytes_replicated"])) for r in rows]
    per_device = sum(r["bytes_per_device"] for r in rows)
    whole = sum(r["bytes_replicated"] for r in rows)
    body.append(("total", "", "", "", _bytes(per_device), _bytes(whole)))
    widths = [max(len(str(row[i])) for row in [header] + body) for i in range(len(header))]
    mesh_text = " x ".join(f"{k}={v}" for k, v in mesh.shape.items())
    lines = [f"state layout on mesh {mesh_text} ({mesh.devices.size} devices)"]
    for row in [header] + body:
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())
    return "\n".join(lines)


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
