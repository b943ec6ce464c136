"""The boxes of a cluster and meshes made of them.

A box is one CS system of the cluster. Here the cluster is the CSX backend's emulated
one: `num_csx` systems (the "systems" axis of the backend's jax mesh), each a wafer grid
of devices. A `Mesh` arranges boxes in an array; its axes are what a tensor's layout
(`cstorch.mesh.sharding_spec`) splits over.
"""

import numpy as np


class Box:
    """One CS system of the cluster: `id` in its mesh, `csx_id` the system it is (0 to
    ``num_csx - 1``), and the ids of the host that drives it on this node
    (`localhost_id`) and in the whole cluster (`globalhost_id`). Here every system is
    driven by this one process, so only `csx_id` places the box."""

    def __init__(self, id, csx_id, localhost_id, globalhost_id):
        for name, value in (("id", id), ("csx_id", csx_id)):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
                raise ValueError(f"Box {name} must be a non-negative int, got {value!r}")
        self.id, self.csx_id = int(id), int(csx_id)
        self.localhost_id, self.globalhost_id = localhost_id, globalhost_id

    def __eq__(self, other):
        return isinstance(other, Box) and (self.id, self.csx_id, self.localhost_id,
                                           self.globalhost_id) == (
            other.id, other.csx_id, other.localhost_id, other.globalhost_id)

    def __hash__(self):
        return hash((self.id, self.csx_id))

    def __repr__(self):
        return (f"Box(id={self.id}, csx_id={self.csx_id}, localhost_id={self.localhost_id!r}, "
                f"globalhost_id={self.globalhost_id!r})")


_meshes: dict = {}   # mesh_id -> the Mesh last made with that id


class Mesh:
    """A mesh of boxes: `box_array`, a (nested) sequence or array of `Box`, gives the
    mesh's shape, one axis per nesting level; `mesh_id` names it for sharding specs
    (`ShardingSpec.mesh_id`). A later mesh with the same id replaces the earlier one."""

    def __init__(self, mesh_id, box_array):
        boxes = np.array(box_array, dtype=object)
        if boxes.ndim == 0 or boxes.size == 0:
            raise ValueError(f"Mesh {mesh_id!r} needs a non-empty array of boxes")
        bad = [b for b in boxes.flat if not isinstance(b, Box)]
        if bad:
            raise TypeError(f"Mesh {mesh_id!r}: box_array must hold Box objects, "
                            f"got {type(bad[0]).__name__}")
        systems = [b.csx_id for b in boxes.flat]
        if len(set(systems)) != len(systems):
            raise ValueError(f"Mesh {mesh_id!r} holds a system twice: csx_ids {systems}")
        self.mesh_id, self.box_array = mesh_id, boxes
        _meshes[mesh_id] = self

    @property
    def shape(self) -> tuple:
        return self.box_array.shape

    @property
    def ndim(self) -> int:
        return self.box_array.ndim

    @property
    def systems(self) -> list:
        """The csx_id of each box, in row-major order."""
        return [b.csx_id for b in self.box_array.flat]

    def __repr__(self):
        return f"Mesh(mesh_id={self.mesh_id!r}, shape={self.shape}, csx_ids={self.systems})"


def mesh_of(mesh_id) -> Mesh:
    """The mesh made last with `mesh_id`."""
    try:
        return _meshes[mesh_id]
    except KeyError:
        raise ValueError(f"no cstorch.mesh.Mesh has mesh_id {mesh_id!r}; known ids: "
                         f"{sorted(map(repr, _meshes))}") from None


def cluster_mesh(num_systems: int) -> Mesh:
    """The cluster's own mesh: its systems in a row, in csx_id order. Not registered."""
    mesh = Mesh.__new__(Mesh)
    mesh.mesh_id = None
    mesh.box_array = np.empty((num_systems,), dtype=object)
    for i in range(num_systems):
        mesh.box_array[i] = Box(i, i, 0, 0)
    return mesh


def find_mesh(mesh) -> Mesh | None:
    """`mesh` as a Mesh: itself, or the mesh of that id."""
    return mesh if isinstance(mesh, Mesh) else mesh_of(mesh)
