"""The ops small models need, forward and backward, equal eager PyTorch.

Weights are random, not constant: a kernel applied flipped, transposed or to the wrong
channel then gives different numbers. Every floating input of a case, weights and biases
included, is differentiated and its gradient compared.
"""
import jax
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import bridge

g = torch.Generator().manual_seed(0)


def rand(*shape):
    return torch.randn(*shape, generator=g)


X = rand(4, 6)
IMG = rand(2, 3, 8, 8)
LABELS = torch.randint(0, 6, (4,), generator=g)
INDICES = torch.tensor([[0, 2], [3, 0]])

# name -> (function of the tensors, the tensors); floating tensors get gradients.
CASES = {
    "linear": (F.linear, (X, rand(3, 6), rand(3))),
    "matmul_bmm": (lambda x: torch.bmm(x.view(2, 2, 6), x.view(2, 6, 2)), (X,)),
    "relu": (F.relu, (X,)), "gelu": (F.gelu, (X,)),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), (X,)),
    "tanh": (torch.tanh, (X,)), "sigmoid": (torch.sigmoid, (X,)), "silu": (F.silu, (X,)),
    "softmax": (lambda x: F.softmax(x, -1), (X,)),
    "log_softmax": (lambda x: F.log_softmax(x, 0), (X,)),
    "cross_entropy": (lambda x: F.cross_entropy(x, LABELS), (X,)),
    "cross_entropy_smooth": (lambda x: F.cross_entropy(x, LABELS, label_smoothing=0.1), (X,)),
    "nll": (lambda x: F.nll_loss(F.log_softmax(x, -1), LABELS, reduction="sum"), (X,)),
    "mse": (F.mse_loss, (X, rand(4, 6))),
    "masked_fill_where": (lambda x: torch.where(x > 0, x, x * 2).masked_fill(x < -1, 0.5), (X,)),
    "views": (lambda x: torch.cat(x.t().split(2), 1).permute(1, 0).reshape(-1, 3).transpose(0, 1),
              (X,)),
    "reductions": (lambda x: x.sum(0) + x.mean(1).sum() + x.amax(1).sum() + x.var(0) + x.norm(),
                   (X,)),
    "conv2d": (lambda x, w, b: F.conv2d(x, w, b, padding=1, stride=2), (IMG, rand(4, 3, 3, 3), rand(4))),
    "conv2d_groups": (lambda x, w: F.conv2d(x, w, groups=3), (IMG, rand(3, 1, 3, 3))),
    "conv2d_asymmetric": (lambda x, w, b: F.conv2d(x, w, b, padding=(1, 0), dilation=(1, 2)),
                          (IMG, rand(5, 3, 2, 3), rand(5))),
    "max_pool2d": (lambda x: F.max_pool2d(x, 3, 2, padding=1), (IMG,)),
    "avg_pool2d": (lambda x: F.avg_pool2d(x, 2), (IMG,)),
    "adaptive_avg_pool2d": (lambda x: F.adaptive_avg_pool2d(x, 1), (IMG,)),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (6,), w, b), (X, rand(6), rand(6))),
    "batch_norm_train": (lambda x, w, b: F.batch_norm(x, torch.zeros(3), torch.ones(3), w, b,
                                                      training=True), (IMG, rand(3), rand(3))),
    "batch_norm_eval": (lambda x, w, b: F.batch_norm(x, torch.full((3,), 0.1), torch.full((3,), 2.0),
                                                     w, b, training=False), (IMG, rand(3), rand(3))),
    "embedding": (lambda w: F.embedding(INDICES, w), (X,)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_forward_and_gradients_match_eager(name):
    fn, examples = CASES[name]
    flags = [t.is_floating_point() for t in examples]

    def step(*xs):
        out = fn(*xs)
        # a ramp, not ones: the gradient of sum(softmax(x)) is zero whatever backward does
        (out * torch.linspace(-1, 1, out.numel()).reshape(out.shape)).sum().backward()
        return [out] + [x.grad for x, f in zip(xs, flags) if f]

    graph = bridge.capture(step, list(examples), flags)
    got = jax.jit(bridge.lower(graph))(*[bridge.tensor_to_jax(t) for t in examples])
    want = step(*[t.clone().requires_grad_(f) for t, f in zip(examples, flags)])
    assert len(got) == len(want) == 1 + sum(flags)
    for ours, theirs in zip(got, want):
        theirs = theirs.detach().numpy()
        assert np.asarray(ours).shape == theirs.shape
        np.testing.assert_allclose(np.asarray(ours), theirs, rtol=1e-4, atol=1e-5)
