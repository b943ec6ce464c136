"""The ops small models need, forward and backward, equal eager PyTorch."""
import jax
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import bridge

g = torch.Generator().manual_seed(0)
X = torch.randn(4, 6, generator=g)
IMG = torch.randn(2, 3, 8, 8, generator=g)
LABELS = torch.randint(0, 6, (4,), generator=g)

CASES = {
    "linear": (lambda x: F.linear(x, torch.ones(3, 6) * 0.1, torch.arange(3.0)), X),
    "matmul_bmm": (lambda x: torch.bmm(x.view(2, 2, 6), x.view(2, 6, 2)), X),
    "relu": (F.relu, X), "gelu": (F.gelu, X), "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), X),
    "tanh": (torch.tanh, X), "sigmoid": (torch.sigmoid, X), "silu": (F.silu, X),
    "softmax": (lambda x: F.softmax(x, -1), X), "log_softmax": (lambda x: F.log_softmax(x, 0), X),
    "cross_entropy": (lambda x: F.cross_entropy(x, LABELS), X),
    "cross_entropy_smooth": (lambda x: F.cross_entropy(x, LABELS, label_smoothing=0.1), X),
    "nll": (lambda x: F.nll_loss(F.log_softmax(x, -1), LABELS, reduction="sum"), X),
    "mse": (lambda x: F.mse_loss(x, torch.zeros(4, 6)), X),
    "masked_fill_where": (lambda x: torch.where(x > 0, x, x * 2).masked_fill(x < -1, 0.5), X),
    "views": (lambda x: torch.cat(x.t().split(2), 1).permute(1, 0).reshape(-1, 3).transpose(0, 1), X),
    "reductions": (lambda x: x.sum(0) + x.mean(1).sum() + x.amax(1).sum() + x.var(0) + x.norm(), X),
    "conv2d": (lambda x: F.conv2d(x, torch.ones(4, 3, 3, 3) * 0.1, torch.ones(4), padding=1, stride=2), IMG),
    "conv2d_groups": (lambda x: F.conv2d(x, torch.ones(3, 1, 3, 3) * 0.1, groups=3), IMG),
    "max_pool2d": (lambda x: F.max_pool2d(x, 3, 2, padding=1), IMG),
    "avg_pool2d": (lambda x: F.avg_pool2d(x, 2), IMG),
    "adaptive_avg_pool2d": (lambda x: F.adaptive_avg_pool2d(x, 1), IMG),
    "layer_norm": (lambda x: F.layer_norm(x, (6,), torch.linspace(0.5, 1.5, 6), torch.ones(6)), X),
    "batch_norm_train": (lambda x: F.batch_norm(x, torch.zeros(3), torch.ones(3), torch.ones(3),
                                                torch.zeros(3), training=True), IMG),
    "batch_norm_eval": (lambda x: F.batch_norm(x, torch.full((3,), 0.1), torch.full((3,), 2.0),
                                               training=False), IMG),
    "embedding": (lambda w: F.embedding(torch.tensor([[0, 2], [3, 0]]), w), X),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_forward_and_gradient_match_eager(name):
    fn, example = CASES[name]

    def step(x):
        out = fn(x)
        (out * torch.linspace(-1, 1, out.numel()).reshape(out.shape)).sum().backward()
        return [out, x.grad]

    graph = bridge.capture(step, [example], [True])
    got = jax.jit(bridge.lower(graph))(bridge.tensor_to_jax(example))
    x = example.clone().requires_grad_(True)
    want = step(x)
    for ours, theirs in zip(got, want):
        theirs = theirs.detach().numpy()
        assert np.asarray(ours).shape == theirs.shape
        np.testing.assert_allclose(np.asarray(ours), theirs, rtol=1e-4, atol=1e-5)
