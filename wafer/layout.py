"""Where each array of a step lives on the mesh.

Batches are split over the systems and the wafer's rows where their leading dimension
allows it; state is replicated. XLA's SPMD partitioner inserts the collectives.
"""
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
