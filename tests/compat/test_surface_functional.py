"""cstorch.nn.functional: the Cerebras functions and their autograd Functions compute what
their eager PyTorch equivalents compute, values and gradients, eagerly and in a traced step."""
import copy

import pytest
import torch
import torch.nn.functional as TF

import cerebras.pytorch as cstorch
from cerebras.pytorch.nn import functional as F


def _leaf(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).requires_grad_()


def _grads(fn, *inputs):
    out = fn(*inputs)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(99))
    return out.detach(), torch.autograd.grad(out, inputs, g)


def _same(a, b):
    return all(torch.allclose(x, y, rtol=1e-5, atol=1e-6) for x, y in zip(a, b)) and len(a) == len(b)


def test_matmul_is_input_times_weight_transposed():
    w, x = _leaf(5, 3, seed=0), _leaf(2, 4, 3, seed=1)
    out, grads = _grads(F.matmul, w, x)
    ref, ref_grads = _grads(lambda w, x: TF.linear(x, w), w, x)
    assert torch.allclose(out, ref, rtol=1e-5) and _same(grads, ref_grads)
    assert torch.allclose(F.matmul(w, x, w.t().detach()), ref, rtol=1e-5)
    with pytest.raises(ValueError, match="weight's transpose"):
        F.matmul(w, x, w.detach())
    with pytest.raises(ValueError, match="out_features, in_features"):
        F.matmul(w[0], x)


def test_bias_add_adds_along_dim():
    x, b = _leaf(2, 3, 4, seed=2), _leaf(3, seed=3)
    out, grads = _grads(lambda x, b: F.bias_add(x, b, 1), x, b)
    ref, ref_grads = _grads(lambda x, b: x + b[:, None], x, b)
    assert torch.equal(out, ref) and _same(grads, ref_grads)
    assert torch.equal(F.bias_add(x, _leaf(4, seed=4), -1), x + _leaf(4, seed=4))
    with pytest.raises(ValueError, match="vector of 4"):
        F.bias_add(x, b, 2)
    with pytest.raises(IndexError, match="not a dimension"):
        F.bias_add(x, b, 3)


def _sparse_reference(x, idx, w):
    out = torch.zeros(*x.shape[:-1], w.shape[0])
    for e in range(w.shape[1]):
        out = out + torch.where((idx == e)[..., None], x @ w[:, e, :].T, 0)
    return out


def test_sparse_matmul_gradients_equal_the_dense_reference():
    x, w = _leaf(2, 3, 2, 5, seed=5), _leaf(4, 3, 5, seed=6)
    idx = torch.tensor([[[0, 2], [1, -1], [2, 2]], [[1, 0], [0, 0], [2, 1]]])
    out, grads = _grads(lambda x, w: F.sparse_matmul(x, idx, w), x, w)
    ref, ref_grads = _grads(lambda x, w: _sparse_reference(x, idx, w), x, w)
    assert torch.allclose(out, ref, rtol=1e-5, atol=1e-6) and _same(grads, ref_grads)


def test_sparse_act_matmul_gradients_equal_the_masked_linear():
    x, w = _leaf(2, 3, 5, seed=7), _leaf(4, 5, seed=8)
    mask = torch.tensor([[1, 0, 3], [0, 0, 1]], dtype=torch.int16)
    out, grads = _grads(lambda x, w: F.sparse_act_matmul(x, mask, w, 2), x, w)
    ref, ref_grads = _grads(lambda x, w: TF.linear(x, w) * (mask != 0)[..., None], x, w)
    assert torch.allclose(out, ref, rtol=1e-5, atol=1e-6) and _same(grads, ref_grads)
    with pytest.raises(ValueError, match="dense_capacity"):
        F.sparse_act_matmul(x, mask, w, -1)


def test_unbind_and_scopes():
    x = _leaf(3, 4, seed=9)
    parts = F.unbind(x)
    assert len(parts) == 3 and all(torch.equal(p, q) for p, q in zip(parts, torch.unbind(x)))
    (parts[0] * 2 + parts[2]).sum().backward()
    assert torch.equal(x.grad, torch.tensor([[2.0] * 4, [0.0] * 4, [1.0] * 4]))
    for fn in (lambda t: F.enter_scope(t, "s"), lambda t: F.exit_scope(t, "s"),
               lambda t: F.scope_boundary(t, "enter", "s"),
               lambda t: F.ExitFunction.apply(t, "s")):
        out, grads = _grads(fn, x)
        assert torch.equal(out, x.detach())
        out.add_(1)   # a new tensor, not a view of the input: in-place use is allowed
        assert _same(grads, _grads(lambda t: t * 1, x)[1])


def test_mesh_functions_are_identities_off_the_cluster():
    x = _leaf(4, 2, seed=10)
    for fn in (lambda t: F.CSXMeshShard.apply(t, "m", (0,), None, (), None, None),
               lambda t: F.CSXMeshAllGather.apply(t, [0]),
               lambda t: F.CSXMeshAllSlice.apply(t, (0,), None),
               lambda t: F.CSXD2DTransfer.apply(t, 0),
               lambda t: F.CSXM2MTransfer.apply(t, "a", "b")):
        out, grads = _grads(fn, x)
        assert torch.equal(out, x.detach()) and _same(grads, _grads(lambda t: t * 1, x)[1])


@pytest.mark.parametrize("call", [
    lambda: F.ranged_matmul(torch.ones(2, 3), torch.ones(1, 2, 3), torch.tensor([1])),
    lambda: F.nth_order_statistic(torch.ones(4), 1, 0),
    lambda: F.conditional_arange(torch.ones(4, dtype=torch.bool), 0, 1),
])
def test_undocumented_kernels_refuse_rather_than_guess(call):
    with pytest.raises(NotImplementedError, match="not implemented: the reference documents no"):
        call()


class _Model(torch.nn.Module):
    def __init__(self, functional):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(4, 6))
        self.bias = torch.nn.Parameter(torch.randn(4))
        self.experts = torch.nn.Parameter(torch.randn(3, 2, 4))
        self.functional = functional

    def forward(self, x, idx, mask):
        if self.functional:
            h = F.bias_add(F.matmul(self.weight, x), self.bias, -1)
            h = F.sparse_act_matmul(F.exit_scope(F.enter_scope(h, "a"), "a"), mask,
                                    self.weight[:, :4].contiguous())
            h = F.sparse_matmul(h[:, None, :].expand(-1, 2, -1), idx, self.experts)
            return torch.stack(F.unbind(h)).sum(1)
        h = TF.linear(x, self.weight, self.bias)
        h = TF.linear(h, self.weight[:, :4]) * (mask != 0)[:, None]
        return _sparse_reference(h[:, None, :].expand(-1, 2, -1), idx, self.experts).sum(1)


def test_functionals_train_in_a_traced_step_as_eager_torch():
    backend = cstorch.backend("CPU")
    torch.manual_seed(0)
    eager = _Model(False)
    model = copy.deepcopy(eager)
    model.functional = True
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.05)
    eager_opt = torch.optim.SGD(eager.parameters(), lr=0.05)

    @cstorch.trace
    def step(x, idx, mask):
        loss = compiled(x, idx, mask).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    g = torch.Generator().manual_seed(3)
    for _ in range(2):
        x, idx = torch.randn(5, 6, generator=g), torch.randint(-1, 2, (5, 2), generator=g)
        mask = torch.randint(0, 2, (5,), generator=g)
        loss = float(step(x, idx, mask))
        ref = eager(x, idx, mask).square().mean()
        ref.backward()
        eager_opt.step()
        eager_opt.zero_grad()
        assert abs(loss - ref.item()) <= 1e-4 * abs(ref.item())
    for name, p in eager.named_parameters():
        assert torch.allclose(getattr(model, name).detach(), p.detach(), rtol=1e-4, atol=1e-5), name
