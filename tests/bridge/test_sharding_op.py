"""bridge::mesh_layout: the identity on values, its layout a sharding constraint on the
mesh the lowering is given, nothing without one."""
import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax.sharding import Mesh, PartitionSpec

import bridge
from bridge.ops.sharding import partition_spec


def test_eager_op_and_gradient_are_the_identity():
    x = torch.randn(3, 4, requires_grad=True)
    y = torch.ops.bridge.mesh_layout(x, [0, 1], [2], [0])
    assert torch.equal(y, x) and y is not x
    (y * torch.arange(4.0)).sum().backward()
    assert torch.equal(x.grad, torch.arange(4.0).expand(3, 4))


def test_partition_spec_lists_the_box_axes_of_each_dimension():
    assert partition_spec(3, [0, -1, 0]) == PartitionSpec(("box0", "box2"), None, None)
    assert partition_spec(2, [1]) == PartitionSpec(None, "box0")
    assert partition_spec(2, [-1, -1]) == PartitionSpec(None, None)


def test_lowering_constrains_only_on_a_given_mesh():
    lower = bridge.LOWERINGS[bridge.MESH_LAYOUT]
    x = jnp.ones((4, 2))
    text = jax.jit(lambda x: lower(x, [0], [1], [0])).lower(x).as_text()
    assert "sharding_constraint" not in text and "Sharding" not in text
    mesh = Mesh(np.array(jax.devices()[:1]).reshape(1, 1, 1), ("box0", "rows", "cols"))
    asked = []

    def resolver(systems, shape):
        asked.append((list(systems), list(shape)))
        return mesh

    with bridge.box_meshes(resolver):
        text = jax.jit(lambda x: lower(x, [0], [1], [0])).lower(x).as_text()
    assert asked == [([0], [1])]
    assert 'sharding_constraint' in text and '"box0"' in text
