"""Where each array of a step lives on the mesh.

Batches are split over the systems and the wafer's grid where their leading dimension
allows it. State is laid over the grid of every system: a matrix's last two dimensions
over rows and columns (each where it divides), and replicated across systems, as data
parallelism between systems keeps a copy of the weights on each. Vectors and scalars
are replicated. XLA's SPMD partitioner inserts the collectives.
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


def state_sharding(mesh: Mesh, shape) -> NamedSharding:
    """The sharding of a parameter or optimizer-state array of `shape`."""
    if len(shape) < 2:
        return replicated(mesh)
    spec = [None] * len(shape)
    for dim, axis in ((-2, "rows"), (-1, "cols")):
        if mesh.shape[axis] > 1 and shape[dim] % mesh.shape[axis] == 0:
            spec[dim] = axis
    return NamedSharding(mesh, PartitionSpec(*spec))
