"""`bridge.to_jax` on exported programs, and errors that point at the user's line."""
import jax
import numpy as np
import pytest
import torch

import bridge


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)
        self.bn = torch.nn.BatchNorm1d(3)

    def forward(self, x):
        return torch.relu(self.bn(self.lin(x))).sum(-1)


def test_to_jax_forward_matches_eager():
    torch.manual_seed(0)
    net = Net().eval()
    x = torch.randn(5, 4)
    ep = torch.export.export(net, (x,))
    fn, state = bridge.to_jax(ep)
    assert "lin.weight" in state
    got = jax.jit(fn)(state, bridge.tensor_to_jax(x))
    np.testing.assert_allclose(np.asarray(got), net(x).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_to_jax_training_mode_returns_buffer_updates():
    net = Net().train()
    x = torch.randn(5, 4)
    ep = torch.export.export(net, (x,))
    fn, state = bridge.to_jax(ep)
    assert fn.has_updates
    out, updates = fn(state, bridge.tensor_to_jax(x))
    assert "bn.running_mean" in updates["buffers"]
    expected = net(x)
    np.testing.assert_allclose(np.asarray(out), expected.detach().numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(updates["buffers"]["bn.running_mean"]),
                               net.bn.running_mean.numpy(), rtol=1e-5, atol=1e-6)


def test_to_jax_refuses_dynamic_batch_dim():
    net = torch.nn.Linear(4, 3)
    batch = torch.export.Dim("batch")
    ep = torch.export.export(net, (torch.randn(5, 4),), dynamic_shapes=({0: batch},))
    with pytest.raises(bridge.DynamicShapeError, match="dimension 0"):
        bridge.to_jax(ep)


def test_missing_lowering_names_op_overload_and_user_line():
    def step(x):
        y = torch.sin(x)
        return [torch.hash_tensor(y)]  # no lowering (a uint64 result): the error must point here
    with pytest.raises(bridge.LoweringError) as info:
        bridge.capture(step, [torch.randn(3)])
    msg = str(info.value)
    assert "aten::hash_tensor" in msg and "overload 'default'" in msg
    assert "test_export_and_errors.py" in msg and "torch.hash_tensor(y)" in msg


def test_missing_lowering_inside_module_forward_names_line():
    class M(torch.nn.Module):
        def forward(self, x):
            return torch.hash_tensor(x)
    m = M()
    with pytest.raises(bridge.LoweringError, match=r"return torch\.hash_tensor\(x\)"):
        bridge.capture(lambda x: [m(x)], [torch.randn(3)])
