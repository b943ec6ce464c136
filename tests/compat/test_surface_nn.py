"""cstorch.nn (SmoothL1Loss, SelectiveGrad), cstorch.nn.functional (one_hot, sparse_matmul,
sparse_act_matmul) and cstorch.cirh (FusedTopK, FusedTopP), checked against PyTorch and
against straightforward references."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as TF

import cerebras.pytorch as cstorch
import cerebras.pytorch.nn.functional as F
from cerebras.pytorch.nn import SmoothL1Loss


def test_one_hot_equals_torch():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 7, (4, 5), generator=g)
    assert torch.equal(F.one_hot(x, num_classes=9), TF.one_hot(x, num_classes=9))
    assert torch.equal(F.one_hot(x, -1), TF.one_hot(x))   # num_classes has no default
    assert F.one_hot(x, 9).dtype == torch.int64
    assert torch.equal(F.one_hot(x.int(), 7), TF.one_hot(x, 7))         # int32 indices
    assert F.one_hot(torch.tensor([-1, 3]), 3).sum().item() == 0        # out of range: zeros
    with pytest.raises(TypeError):
        F.one_hot(torch.ones(2), 3)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("beta", [1.0, 0.25, 0.0])
def test_smooth_l1_loss_equals_torch(reduction, beta):
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(6, 5, generator=g) * 2, torch.randn(6, 5, generator=g)
    a.requires_grad_(True)
    ours = SmoothL1Loss(reduction=reduction, beta=beta)(a, b)
    theirs = nn.SmoothL1Loss(reduction=reduction, beta=beta)(a, b)
    assert torch.allclose(ours, theirs, rtol=1e-6, atol=1e-7)
    ga, = torch.autograd.grad(ours.sum(), a)
    gt, = torch.autograd.grad(theirs.sum(), a)
    assert torch.allclose(ga, gt, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError):
        SmoothL1Loss(beta=-1)


def _sparse_matmul_reference(x, idx, w):
    out = torch.zeros(x.shape[:-1] + (w.shape[0],))
    for pos in torch.cartesian_prod(*[torch.arange(s) for s in idx.shape]):
        pos = tuple(pos.tolist())
        e = int(idx[pos])
        if 0 <= e < w.shape[1]:
            out[pos] = w[:, e, :] @ x[pos]
    return out


def test_sparse_matmul_applies_each_slots_expert():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 3, 2, 5, generator=g)                 # (B, S, K, in)
    w = torch.randn(4, 6, 5, generator=g)                    # (out, experts, in)
    idx = torch.randint(0, 6, (2, 3, 2), generator=g)
    idx[0, 1, 0] = -1                                         # no expert: zeros
    out = F.sparse_matmul(x, idx, w)
    assert out.shape == (2, 3, 2, 4)
    assert torch.allclose(out, _sparse_matmul_reference(x, idx, w), rtol=1e-5, atol=1e-5)
    assert torch.equal(out[0, 1, 0], torch.zeros(4))
    with pytest.raises(ValueError):
        F.sparse_matmul(x, idx, w[0])


def test_sparse_act_matmul_computes_active_tokens_only():
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(2, 4, 5, generator=g), torch.randn(3, 5, generator=g)
    mask = torch.tensor([[1, 0, 1, 1], [0, 0, 1, 0]], dtype=torch.int16)
    out = F.sparse_act_matmul(x, mask, w, dense_capacity=3)
    expected = (x @ w.T) * mask[..., None]
    assert torch.allclose(out, expected, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError):
        F.sparse_act_matmul(x, mask[:, :2], w)


def test_functionals_trace_into_a_step():
    cstorch.backend("CPU")
    g = torch.Generator().manual_seed(4)
    x, w = torch.randn(2, 3, 2, 5, generator=g), torch.randn(4, 3, 5, generator=g)
    idx = torch.randint(0, 3, (2, 3, 2), generator=g)

    @cstorch.trace
    @torch.no_grad()
    def step(x, idx, w):
        return F.sparse_matmul(x, idx, w), F.one_hot(idx, num_classes=3)

    out, hot = step(x, idx, w)
    assert torch.allclose(out.host(), _sparse_matmul_reference(x, idx, w), rtol=1e-5, atol=1e-5)
    assert torch.equal(hot.host(), TF.one_hot(idx, 3))


def test_selective_grad_masks_gradients_eagerly_and_keeps_names():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    with torch.no_grad():
        model[0].weight[0].zero_()
    sg = cstorch.nn.SelectiveGrad("*0.weight")
    model.apply(sg)
    assert sorted(sg.selected) == ["0.weight"]
    x = torch.randn(5, 4)
    reference = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    reference.load_state_dict(model.state_dict())
    out = model(x)
    assert torch.equal(out, reference(x))
    out.sum().backward()
    reference(x).sum().backward()
    mask = model[0].weight.detach() != 0
    assert torch.equal(model[0].weight.grad, reference[0].weight.grad * mask)
    assert torch.equal(model[0].weight.grad[0], torch.zeros(4))
    assert torch.equal(model[1].weight.grad, reference[1].weight.grad)
    assert list(model.state_dict()) == list(reference.state_dict())
    assert isinstance(model[0].weight, nn.Parameter)             # the attribute is restored
    with pytest.raises(ValueError):
        cstorch.nn.SelectiveGrad("*", "unknown")


def test_selective_grad_in_a_traced_training_step():
    torch.manual_seed(0)
    cstorch.backend("CPU")
    model = nn.Linear(4, 3)
    keep = torch.tensor([[True, False, True, False]] * 3)
    model.apply(cstorch.nn.SelectiveGrad("weight", lambda p: keep))
    before = model.weight.detach().clone()
    compiled = cstorch.compile(model)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.5)

    @cstorch.trace
    def step(x):
        loss = compiled(x).square().sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    step(torch.randn(6, 4))
    after = model.weight.host()
    assert torch.equal(after[~keep], before[~keep])           # no gradient, no change
    assert not torch.allclose(after[keep], before[keep])


def test_fused_top_k_equals_torch_topk():
    g = torch.Generator().manual_seed(5)
    probs = torch.softmax(torch.randn(3, 20, generator=g), dim=-1)
    fused = cstorch.cirh.FusedTopK(probs, k=5, dimension=1)
    values, indices = torch.topk(probs, 5, dim=1)
    assert torch.equal(fused.values, values) and torch.equal(fused.indices, indices)
    with pytest.raises(ValueError):
        cstorch.cirh.FusedTopK(probs, k=21, dimension=1)


def _top_p_reference(probs, k, p, u):
    out = []
    for row, ur in zip(probs, u):
        values, indices = torch.sort(row, descending=True)
        values, indices = values[:k], indices[:k]
        n, mass = 0, 0.0
        while n < k and (n == 0 or mass < p):
            mass += float(values[n])
            n += 1
        kept = values[:n] / values[:n].sum()
        pick = int(torch.searchsorted(torch.cumsum(kept, 0), float(ur), right=True))
        out.append(int(indices[min(pick, n - 1)]))
    return torch.tensor(out).reshape(-1, 1)


@pytest.mark.parametrize("k,p", [(5, 1.0), (5, 0.5), (8, 0.05), (1, 0.9)])
def test_fused_top_p_samples_within_the_nucleus(k, p):
    g = torch.Generator().manual_seed(6)
    probs = torch.softmax(torch.randn(16, 30, generator=g) * 2, dim=-1)
    u = torch.rand(16, 1, generator=g)
    fused = cstorch.cirh.FusedTopK(probs, k=k, dimension=1)
    pred = cstorch.cirh.FusedTopP(fused, p=torch.full_like(probs[:, :1], p), u=u,
                                  k=torch.full_like(probs[:, :1], k, dtype=torch.int32))
    assert pred.shape == (16, 1)
    assert torch.equal(pred, _top_p_reference(probs, k, p, u))
    # u = 0 takes the most likely token; p tiny keeps only it whatever u is.
    greedy = cstorch.cirh.FusedTopP(fused, p=p, u=torch.zeros(16, 1), k=k)
    assert torch.equal(greedy, probs.argmax(-1, keepdim=True))
    only_first = cstorch.cirh.FusedTopP(fused, p=1e-9, u=u, k=k)
    assert torch.equal(only_first, probs.argmax(-1, keepdim=True))
