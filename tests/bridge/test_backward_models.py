"""Backward ops of resampling, grid sampling, cdist and embedding bags: each op's input
gradients against eager autograd, then small models trained with them against eager
PyTorch (issue 10: these models failed in `loss.backward()`)."""
import copy

import jax
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import bridge
import cerebras.pytorch as cstorch
from tests.models import rel_err

TOL = 1e-5


def _check_grads(fn, inputs, wants_grad, reference=None):
    """`fn`'s output and the gradient of every input flagged in `wants_grad`, lowered
    and eager (eager runs `reference` in place of `fn` where given), for one random
    cotangent."""
    def step(fn, *args):
        *xs, cotangent = args
        out = fn(*xs)
        leaves = [x for x, flag in zip(xs, wants_grad) if flag]
        return [out, *torch.autograd.grad(out, leaves, cotangent)]

    leaves = [x.clone().requires_grad_(flag) for x, flag in zip(inputs, wants_grad)]
    shape = fn(*leaves).shape
    cotangent = torch.randn(shape, generator=torch.Generator().manual_seed(7))
    want = step(reference or fn, *leaves, cotangent)
    graph = bridge.capture(lambda *args: step(fn, *args), [*inputs, cotangent],
                           [*wants_grad, False])
    got = jax.jit(bridge.lower(graph))(*[bridge.tensor_to_jax(t) for t in [*inputs, cotangent]])
    assert len(got) == len(want)
    for ours, theirs in zip(got, want):
        assert tuple(ours.shape) == tuple(theirs.shape)
        assert rel_err(ours, theirs) < TOL


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _concat(*outputs):
    """Several variants as one output, so that one capture and compile checks them all."""
    return torch.cat([o.flatten() for o in outputs])


_INTERP = [(1, "nearest", None), (1, "nearest-exact", None), (1, "linear", True),
           (1, "linear", False), (2, "nearest", None), (2, "nearest-exact", None),
           (2, "bilinear", True), (2, "bilinear", False), (2, "bicubic", True),
           (2, "bicubic", False), (3, "nearest", None), (3, "nearest-exact", None),
           (3, "trilinear", True), (3, "trilinear", False)]


@pytest.mark.parametrize("nd,mode,align_corners", _INTERP,
                         ids=[f"{m}{n}d-{a}" for n, m, a in _INTERP])
def test_interpolate_backward(nd, mode, align_corners):
    # integer and fractional scale factors (the scales reach the backward op) and an
    # output size, downsampling
    resizes = [{"scale_factor": 2}, {"scale_factor": 1.7}, {"size": [3, 4, 2][:nd]}]
    _check_grads(lambda x: _concat(*[F.interpolate(x, mode=mode, align_corners=align_corners,
                                                   **r) for r in resizes]),
                 [_randn(2, 3, *[5, 6, 4][:nd])], [True])


def test_antialiased_bilinear_backward():
    _check_grads(lambda x: _concat(*[F.interpolate(x, size=(3, 5), mode="bilinear",
                                                   antialias=True, align_corners=a)
                                     for a in (True, False)]), [_randn(2, 3, 8, 9)], [True])


def _grid_cases():
    """Every mode with every padding, alternating align_corners, plus bilinear with
    reflection both ways (the STN's case); the rest of the matrix runs with `-m slow`."""
    cases = []
    for i, mode in enumerate(["bilinear", "nearest", "bicubic"]):
        for j, padding in enumerate(["zeros", "border", "reflection"]):
            for align in (True, False):
                fast = (i + j + align) % 2 == 0 or (mode, padding) == ("bilinear", "reflection")
                cases.append(pytest.param(mode, padding, align,
                                          marks=() if fast else pytest.mark.slow))
    return cases


@pytest.mark.parametrize("mode,padding,align_corners", _grid_cases())
def test_grid_sample_backward(mode, padding, align_corners):
    # the grid reaches past the borders so that padding decides some samples
    grid = torch.rand(2, 4, 5, 2, generator=torch.Generator().manual_seed(1)) * 2.6 - 1.3
    _check_grads(lambda x, g: F.grid_sample(x, g, mode=mode, padding_mode=padding,
                                            align_corners=align_corners),
                 [_randn(2, 3, 5, 6), grid], [True, True])


def test_grid_sample_3d_backward():
    grid = torch.rand(2, 3, 4, 2, 3, generator=torch.Generator().manual_seed(1)) * 2.4 - 1.2
    _check_grads(lambda x, g: _concat(*[F.grid_sample(x, g, mode=m, padding_mode="border",
                                                      align_corners=False)
                                        for m in ("bilinear", "nearest")]),
                 [_randn(2, 2, 3, 4, 5), grid], [True, True])


@pytest.mark.parametrize("p", [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, float("inf")])
def test_cdist_backward(p):
    # batch dims broadcast (1 against 2), as ATen allows
    _check_grads(lambda a, b: torch.cdist(a, b, p=p), [_randn(1, 4, 3), _randn(2, 5, 3, seed=1)],
                 [True, True])


def test_cdist_backward_at_zero_distance():
    # equal rows (zero distance) and equal coordinates (zero differences): ATen's
    # gradient is 0 there, where the p-norm's derivative is 0/0 or 0 * inf
    a = torch.tensor([[0.0, 1.0, 2.0], [1.0, 1.0, 1.0]])
    b = torch.tensor([[0.0, 3.0, 2.0], [1.0, 1.0, 1.0], [2.0, 0.5, 1.0]])
    _check_grads(lambda a, b: _concat(*[torch.cdist(a, b, p=p) for p in (0.5, 1.5, 2.0, 3.0)]),
                 [a, b], [True, True])


_TOKENS = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 0, 7, 7, 3])
_OFFSETS = torch.tensor([0, 3, 5, 5, 9])  # bag 2 is empty


def _bags_by_embedding(weight, tokens, offsets, mode):
    """Sum or mean bags built from F.embedding, whose `scale_grad_by_freq` divides each
    row's gradient by how often the row occurs, as documented. The reference for that
    flag: eager embedding_bag on the CPU divides some rows by another row's count in
    torch 2.13 (pytorch/pytorch#190063)."""
    rows = F.embedding(tokens, weight, scale_grad_by_freq=True)
    bag = torch.searchsorted(offsets, torch.arange(len(tokens)), right=True) - 1
    out = torch.zeros(len(offsets), weight.shape[1]).index_add(0, bag, rows)
    if mode == "mean":
        out = out / torch.bincount(bag, minlength=len(offsets)).clamp(min=1)[:, None]
    return out


# max mode refuses scale_grad_by_freq (in eager PyTorch too): that pair is not a case
@pytest.mark.parametrize("mode, layout", [
    (mode, layout) for mode in ("sum", "mean", "max")
    for layout in ("offsets", "2d", "last_offset", "padding", "freq")
    if (mode, layout) != ("max", "freq")])
def test_embedding_bag_backward(mode, layout):
    kwargs, reference = {"mode": mode}, None
    if layout == "2d":
        tokens, offsets = _TOKENS.view(3, 4), None
    elif layout == "last_offset":
        tokens, offsets = _TOKENS, torch.tensor([0, 3, 5, 5, 9, 12])
        kwargs["include_last_offset"] = True
    else:
        tokens, offsets = _TOKENS, _OFFSETS
        if layout == "padding":
            kwargs["padding_idx"] = 4
        elif layout == "freq":
            kwargs["scale_grad_by_freq"] = True
            reference = lambda w, t, o: _bags_by_embedding(w, t, o, mode)
    inputs = [_randn(10, 4), tokens] + ([] if offsets is None else [offsets])
    _check_grads(lambda w, t, o=None: F.embedding_bag(t, w, o, **kwargs),
                 inputs, [True] + [False] * (len(inputs) - 1), reference)


@pytest.mark.parametrize("mode,padding_idx", [(0, 4), (1, -1), (2, 4)])
def test_embedding_bag_dense_backward_op(mode, padding_idx):
    # autograd calls `_embedding_bag_backward`; the dense op takes eager's offset2bag,
    # bag sizes and maximum rows as given (sum mode fills offset2bag only with padding)
    aten = torch.ops.aten
    weight = _randn(10, 4)
    _, offset2bag, bag_size, max_rows = aten._embedding_bag(
        weight, _TOKENS, _OFFSETS, False, mode, False, None, False, padding_idx)
    grad = _randn(len(_OFFSETS), 4, seed=5)

    def backward(grad, offset2bag, bag_size, max_rows):
        return [aten._embedding_bag_dense_backward(grad, _TOKENS, offset2bag, bag_size, max_rows,
                                                   10, False, mode, None, padding_idx)]
    inputs = [grad, offset2bag, bag_size, max_rows]
    got = jax.jit(bridge.lower(bridge.capture(backward, inputs)))(
        *[bridge.tensor_to_jax(t) for t in inputs])
    assert rel_err(got[0], backward(*inputs)[0]) < TOL


@pytest.mark.parametrize("padding_idx", [None, 4])
def test_embedding_bag_per_sample_weights_backward(padding_idx):
    weights = torch.rand(12, generator=torch.Generator().manual_seed(3))
    _check_grads(lambda w, p, t, o: F.embedding_bag(t, w, o, mode="sum", per_sample_weights=p,
                                                    padding_idx=padding_idx),
                 [_randn(10, 4), weights, _TOKENS, _OFFSETS], [True, True, False, False])


# --- training -------------------------------------------------------------------------


def _train_like_eager(model, batches, loss_fn, lr=0.1):
    """Five SGD steps traced and eagerly from the same weights: every loss and, at the
    end, every parameter within TOL. Returns the eager reference for further checks."""
    reference = copy.deepcopy(model)
    cstorch.backend("CPU")
    compiled = cstorch.compile(model)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=lr)

    @cstorch.trace
    def step(*batch):
        loss = loss_fn(compiled, *batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    ref_opt = torch.optim.SGD(reference.parameters(), lr=lr)
    for batch in batches:
        loss = step(*batch)
        ref_loss = loss_fn(reference, *batch)
        ref_opt.zero_grad()
        ref_loss.backward()
        ref_opt.step()
        assert rel_err(loss, ref_loss.detach()) < TOL
    assert step.captures == 1
    ours, theirs = model.state_dict(), reference.state_dict()
    assert ours.keys() == theirs.keys()
    for name in theirs:
        assert rel_err(ours[name], theirs[name]) < TOL, name
    return reference


def _block(cin, cout, groups, **conv):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, **conv), nn.GroupNorm(groups, cout),
                         nn.SiLU())


class TinyUNet(nn.Module):
    """16x16 -> 8x8 -> 16x16, decoded three ways: a transposed convolution, bilinear
    upsampling (both corner conventions) and nearest upsampling."""

    def __init__(self):
        super().__init__()
        self.enc = _block(3, 8, 2)
        self.down = _block(8, 8, 4, stride=2)
        self.mid = _block(8, 8, 2)
        self.up_conv = nn.ConvTranspose2d(8, 4, 2, stride=2)
        self.up_corners = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True)
        self.up_centres = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)
        self.up_nearest = nn.Upsample(scale_factor=2, mode="nearest")
        self.out = nn.Conv2d(8 + 4 + 3 * 8, 3, 3, padding=1)

    def forward(self, x):
        skip = self.enc(x)
        m = self.mid(self.down(skip))
        ups = [self.up_conv(m), self.up_corners(m), self.up_centres(m), self.up_nearest(m)]
        return self.out(torch.cat([skip, *ups], 1))


def test_unet_trains_like_eager():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    batches = [(torch.randn(2, 3, 16, 16, generator=gen), torch.randn(2, 3, 16, 16, generator=gen))
               for _ in range(5)]
    _train_like_eager(TinyUNet(), batches, lambda m, x, y: F.mse_loss(m(x), y))


class SpatialTransformer(nn.Module):
    """A localisation net predicts an affine map; the image is resampled through it twice
    (bilinear with zero padding, and with reflection and corner alignment) and classified.
    The localisation net learns only through the grid's gradient."""

    def __init__(self):
        super().__init__()
        self.loc = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.AvgPool2d(4),
                                 nn.Flatten(), nn.Linear(4 * 3 * 3, 6))
        self.head = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.ReLU(), nn.Flatten(),
                                  nn.Linear(4 * 12 * 12, 5))

    def forward(self, x):
        identity = torch.tensor([1.0, 0, 0, 0, 1, 0])
        theta = (identity + 0.3 * self.loc(x)).view(-1, 2, 3)
        views = []
        for align in (False, True):
            grid = F.affine_grid(theta, list(x.shape), align_corners=align)
            views.append(F.grid_sample(x, grid, padding_mode="reflection" if align else "zeros",
                                       align_corners=align))
        return self.head(torch.cat(views, 1))


def test_spatial_transformer_trains_like_eager():
    torch.manual_seed(0)
    model = SpatialTransformer()
    start = copy.deepcopy(model.loc.state_dict())
    gen = torch.Generator().manual_seed(2)
    batches = [(torch.randn(4, 1, 12, 12, generator=gen), torch.randint(0, 5, (4,), generator=gen))
               for _ in range(5)]
    _train_like_eager(model, batches, lambda m, x, y: F.cross_entropy(m(x), y))
    for name, value in model.loc.state_dict().items():
        assert not torch.equal(value, start[name]), f"loc.{name} got no gradient"


class BagMetric(nn.Module):
    """Bags of token ids (mean and weighted sum) embedded, then scored by negative
    Euclidean distance to learned class centres."""

    def __init__(self, vocab=40, dim=8, classes=5):
        super().__init__()
        self.mean_bag = nn.EmbeddingBag(vocab, dim, mode="mean")
        self.sum_bag = nn.EmbeddingBag(vocab, dim, mode="sum")
        self.proj = nn.Linear(2 * dim, dim)
        self.centres = nn.Parameter(torch.randn(classes, dim))

    def forward(self, tokens, offsets, weights):
        bags = torch.cat([self.mean_bag(tokens, offsets),
                          self.sum_bag(tokens, offsets, per_sample_weights=weights)], 1)
        return -torch.cdist(self.proj(bags), self.centres)


def test_embedding_bag_cdist_trains_like_eager():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(3)
    batches = []
    for _ in range(5):
        # 6 bags over 20 tokens, with offsets (and so bag lengths) differing per step
        cuts = torch.randperm(19, generator=gen)[:5].add(1).sort().values
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), cuts])
        batches.append((torch.randint(0, 40, (20,), generator=gen), offsets,
                        torch.rand(20, generator=gen), torch.randint(0, 5, (6,), generator=gen)))
    _train_like_eager(BagMetric(), batches, lambda m, t, o, w, y: F.cross_entropy(m(t, o, w), y))
