"""Lowerings the OpInfo conformance run (tools/conformance) found wrong or missing, each
checked forward and, where it has one, backward against eager PyTorch."""
import jax
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import bridge

g = torch.Generator().manual_seed(0)
IMG = torch.randn(1, 2, 16, 16, generator=g)
VOL = torch.randn(2, 2, 4, 6, 6, generator=g)

# name -> (function of the tensors, the tensors); floating tensors get gradients.
CASES = {
    # an empty sorted sequence: every value goes to position 0
    "searchsorted_empty": (lambda s, v: torch.searchsorted(s, v),
                           (torch.zeros(0, 0), torch.zeros(0, 0))),
    # ATen truncates (i + u) * alpha, which differs from floor for a given u outside [0, 1)
    "fractional_max_pool2d_given_samples": (
        lambda x: F.fractional_max_pool2d(x, (2, 2), output_ratio=(0.5, 0.5),
                                          _random_samples=torch.tensor([[[0.3, -0.7]] * 2])),
        (IMG,)),
    "fractional_max_pool3d_backward": (
        lambda x: F.fractional_max_pool3d(x, 2, output_size=(2, 3, 3),
                                          _random_samples=torch.full((2, 2, 3), 0.4)),
        (VOL,)),
    "hardshrink_backward": (lambda x: F.hardshrink(x, 0.5), (torch.linspace(-1, 1, 9),)),
    "softshrink_backward": (lambda x: F.softshrink(x, 0.5), (torch.linspace(-1, 1, 9),)),
    # output depth == input depth: the shapes alone look like a 2-d pool of a 4-d batch
    "adaptive_max_pool3d_same_depth": (lambda x: F.adaptive_max_pool3d(x, (4, 3, 2)), (VOL,)),
    # the left pad crops the whole width away; replication still repeats the last column
    "replicate_pad_negative": (lambda x: F.pad(x, (-6, 5, 1, 0), mode="replicate"), (VOL[0],)),
    "repeat_interleave_output_size": (
        lambda r: torch.repeat_interleave(r, output_size=6), (torch.tensor([1, 0, 3, 2]),)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_eager(name):
    fn, examples = CASES[name]
    flags = [t.is_floating_point() and t.numel() > 0 for t in examples]

    def step(*xs):
        out = fn(*xs)
        if any(flags):
            ramp = torch.linspace(-1, 1, out.numel()).reshape(out.shape)
            (out * ramp).sum().backward()
        return [out] + [x.grad for x, f in zip(xs, flags) if f]

    graph = bridge.capture(step, list(examples), flags)
    got = jax.jit(bridge.lower(graph))(*[bridge.tensor_to_jax(t) for t in examples])
    want = step(*[t.clone().requires_grad_(f) for t, f in zip(examples, flags)])
    assert len(got) == len(want)
    for ours, theirs in zip(got, want):
        theirs = theirs.detach().numpy()
        assert np.asarray(ours).shape == theirs.shape
        np.testing.assert_allclose(np.asarray(ours), theirs, rtol=1e-5, atol=1e-6)
