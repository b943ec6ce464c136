"""How a tensor is laid out over a mesh of boxes: one `Placement` per mesh axis, as in
`torch.distributed.tensor`: `Shard(dim)` splits tensor dimension `dim` over the axis,
`Replicate()` keeps a whole copy on each box along it."""
from cstorch.mesh.boxes import Mesh, find_mesh


class Placement:
    """What one mesh axis does with a tensor: `Shard` or `Replicate`."""

    def is_shard(self):
        return isinstance(self, Shard)

    def is_replicate(self):
        return isinstance(self, Replicate)


class Shard(Placement):
    """Split tensor dimension `dim` (negative counts from the end) into equal slices, one
    per box along the mesh axis."""

    def __init__(self, dim):
        if not isinstance(dim, int) or isinstance(dim, bool):
            raise TypeError(f"Shard dim must be an int, got {dim!r}")
        self.dim = dim

    def __eq__(self, other):
        return isinstance(other, Shard) and other.dim == self.dim

    def __hash__(self):
        return hash(("Shard", self.dim))

    def __repr__(self):
        return f"Shard(dim={self.dim})"


class Replicate(Placement):
    """Keep the whole tensor on every box along the mesh axis."""

    def __init__(self):
        pass

    def __eq__(self, other):
        return isinstance(other, Replicate)

    def __hash__(self):
        return hash("Replicate")

    def __repr__(self):
        return "Replicate()"


class ShardingSpec:
    """A layout over the mesh `mesh_id`: `split_axes` has one entry per mesh axis, the
    tensor dimension that axis splits, or None where the axis holds copies.
    `partial_axes` are mesh axes along which each box would hold a partial result to be
    combined by `partial_type`; `devices` the boxes the layout is on (None: all of the
    mesh's). `sharding_spec` builds one from placements."""

    def __init__(self, mesh_id, split_axes, partial_axes, partial_type, devices):
        self.mesh_id = mesh_id
        self.split_axes = tuple(split_axes)
        self.partial_axes = tuple(partial_axes or ())
        self.partial_type = partial_type
        self.devices = devices

    def __eq__(self, other):
        return isinstance(other, ShardingSpec) and vars(self) == vars(other)

    def __repr__(self):
        return ("ShardingSpec(" + ", ".join(f"{k}={v!r}" for k, v in vars(self).items()) + ")")


def split_axes_of(sharding_array, mesh: Mesh) -> tuple:
    """`sharding_array` (one `Placement` per axis of `mesh`) as split axes."""
    placements = list(sharding_array) if isinstance(sharding_array, (list, tuple)) else None
    if placements is None or not all(isinstance(p, Placement) for p in placements):
        raise TypeError(f"sharding_array must be a list of cstorch.mesh.Shard / Replicate, one "
                        f"per mesh axis, got {sharding_array!r}")
    if len(placements) != mesh.ndim:
        raise ValueError(f"sharding_array has {len(placements)} placements for a mesh of "
                         f"{mesh.ndim} axes (shape {mesh.shape}); give one per axis")
    return tuple(p.dim if isinstance(p, Shard) else None for p in placements)


def sharding_spec(sharding_array, mesh, device=None):
    """The `ShardingSpec` that lays a tensor over `mesh` (a `Mesh` or its id) as
    `sharding_array` says: one `Shard(dim)` or `Replicate()` per mesh axis."""
    mesh = find_mesh(mesh)
    if device is not None:
        raise NotImplementedError(
            "sharding_spec(device=...) is not supported: what a layout restricted to one "
            "device means is not documented; leave device=None for a layout over the whole mesh")
    return ShardingSpec(mesh.mesh_id, split_axes_of(sharding_array, mesh), (), None, None)
