"""cstorch.mesh's types: boxes, meshes, placements and sharding specs, and their errors.
(Layouts on the emulated cluster: tests/wafer/test_mesh_layout.py.)"""
import pytest
import torch

import cerebras.pytorch as cstorch
from cerebras.pytorch import mesh as M


def _boxes(*csx_ids):
    return [M.Box(i, c, 0, 0) for i, c in enumerate(csx_ids)]


def test_placements_say_what_they_are():
    assert M.Shard(1).is_shard() and not M.Shard(1).is_replicate()
    assert M.Replicate().is_replicate() and not M.Replicate().is_shard()
    assert M.Shard(-1) == M.Shard(-1) != M.Shard(0)
    assert isinstance(M.Shard(0), M.Placement) and isinstance(M.Replicate(), M.Placement)
    with pytest.raises(TypeError, match="Shard dim must be an int"):
        M.Shard("0")


def test_sharding_spec_gives_each_mesh_axis_its_split_dimension():
    mesh = M.Mesh("grid", [_boxes(0, 1), _boxes(2, 3)])
    assert mesh.shape == (2, 2) and mesh.systems == [0, 1, 2, 3]
    spec = M.sharding_spec([M.Replicate(), M.Shard(1)], mesh)
    assert spec == M.ShardingSpec("grid", (None, 1), (), None, None)
    assert M.sharding_spec([M.Shard(0), M.Shard(0)], "grid").split_axes == (0, 0)   # by id


def test_sharding_spec_errors():
    mesh = M.Mesh("row", _boxes(0, 1))
    with pytest.raises(ValueError, match="2 placements for a mesh of 1 axes"):
        M.sharding_spec([M.Shard(0), M.Replicate()], mesh)
    with pytest.raises(TypeError, match="one per mesh axis"):
        M.sharding_spec([0], mesh)
    with pytest.raises(ValueError, match="no cstorch.mesh.Mesh has mesh_id 'nowhere'"):
        M.sharding_spec([M.Shard(0)], "nowhere")
    with pytest.raises(NotImplementedError, match="device"):
        M.sharding_spec([M.Shard(0)], mesh, device=0)


def test_box_and_mesh_errors():
    with pytest.raises(ValueError, match="csx_id must be a non-negative int"):
        M.Box(0, -1, 0, 0)
    with pytest.raises(TypeError, match="must hold Box objects"):
        M.Mesh("bad", [0, 1])
    with pytest.raises(ValueError, match="holds a system twice"):
        M.Mesh("twice", _boxes(0, 0))
    with pytest.raises(ValueError, match="non-empty"):
        M.Mesh("empty", [])


def test_cpu_backend_layout_functions_are_the_identity_in_a_step():
    cstorch.backend("CPU")
    mesh = M.Mesh("pair", _boxes(0, 1))
    spec = M.sharding_spec([M.Shard(0)], mesh)
    x = torch.randn(4, 6)

    @cstorch.trace
    def step(x):
        y = M.distribute_tensor(x, spec, None) * 2
        y = M.all_gather(M.all_slice(y, [M.Shard(1)], None), [0])
        return M.m2m_transfer(M.d2d_transfer(y, 1), mesh, mesh)

    assert torch.equal(step(x).host(), x * 2)
    graph = next(iter(step.programs.values()))[0].graph
    assert [n.target for n in graph.graph.nodes if n.op == "call_function"] \
        == [torch.ops.aten.mul.Tensor]


def test_transfers_and_dense_capacity_warn_once_that_they_place_nothing():
    import warnings as w
    from cstorch.mesh import layout
    layout._warned.clear()
    x = torch.randn(3)
    with pytest.warns(UserWarning, match="d2d_transfer places nothing here"):
        assert M.d2d_transfer(x, 1) is x
    with pytest.warns(UserWarning, match="m2m_transfer places nothing here"):
        assert M.m2m_transfer(x, None, None) is x
    with w.catch_warnings():
        w.simplefilter("error")
        M.d2d_transfer(x, 2)   # once
    with pytest.warns(UserWarning, match=r"dense_capacity=\.\.\.\) places nothing"):
        cstorch.nn.functional.sparse_act_matmul(torch.randn(2, 4), torch.ones(2),
                                                torch.randn(3, 4), dense_capacity=2)
