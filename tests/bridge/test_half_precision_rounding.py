"""Half-precision ops round where eager PyTorch rounds: a linear layer or a convolution adds
its bias to the float32 accumulator and rounds once (a transposed convolution rounds the
product, then adds), and XLA keeps every rounding the program asks for (with its excess
precision on, an op reading a half-precision result widened back to float32 saw the
unrounded value). Compared bit for bit with eager torch under `cstorch.amp.autocast`."""
import pytest
import torch

import cerebras.pytorch as cstorch


@pytest.fixture
def half():
    before = cstorch.amp.get_half_dtype()
    yield lambda name: cstorch.amp.set_half_dtype(name)
    cstorch.amp.set_half_dtype(before)


def _traced_and_eager(module, *inputs):
    with cstorch.amp.autocast():
        eager = module(*inputs)
    compiled = cstorch.compile(module, cstorch.backend("CPU"))

    @cstorch.trace
    def step(*xs):
        with cstorch.amp.autocast():
            return compiled(*xs)

    return torch.as_tensor(step(*inputs)), eager


def _assert_same_bits(traced, eager, ties=0.0):
    """Equal bit for bit, but for a fraction `ties` of the elements, each one unit in the
    last place apart: sums whose float32 value lies a hair from halfway between two half
    values, which a different order of the same additions rounds the other way."""
    assert traced.dtype == eager.dtype
    differ = traced != eager
    assert float(differ.float().mean()) <= ties, \
        f"{float(differ.float().mean()):.2%} of the elements differ"
    if differ.any():
        ulp = torch.finfo(eager.dtype).eps * eager[differ].float().abs()
        assert bool(((traced[differ].float() - eager[differ].float()).abs() <= ulp).all())


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_linear_layer_adds_its_bias_before_rounding(half, dtype):
    half(dtype)
    torch.manual_seed(0)
    traced, eager = _traced_and_eager(torch.nn.Linear(256, 32), torch.randn(64, 256))
    _assert_same_bits(traced, eager, ties=0.005)   # rounding the product first: 27%


@pytest.mark.parametrize("transposed", [False, True])
def test_a_convolution_rounds_where_eager_does(half, transposed):
    """The transposed convolution as patch-embedding heads use it (kernel = stride): where
    its windows overlap, eager PyTorch also rounds each overlapping addition (col2im into a
    bfloat16 output), which is not reproduced (docs/modelzoo.md)."""
    half("bfloat16")
    torch.manual_seed(0)
    conv = (torch.nn.ConvTranspose2d(16, 8, 2, stride=2) if transposed
            else torch.nn.Conv2d(16, 8, 3, stride=2, padding=1))
    traced, eager = _traced_and_eager(conv, torch.randn(4, 16, 8, 8))
    _assert_same_bits(traced, eager, ties=0.005)


class _LinearNorm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(64, 32)
        self.norm = torch.nn.LayerNorm(32, eps=1e-6, elementwise_affine=False)

    def forward(self, x):
        return self.norm(self.linear(x))


def test_a_norm_reads_the_rounded_output_of_the_layer_before(half):
    """LayerNorm widens the linear layer's bfloat16 output to float32; XLA's excess
    precision let it read the product unrounded."""
    half("bfloat16")
    torch.manual_seed(0)
    traced, eager = _traced_and_eager(_LinearNorm(), torch.randn(4, 16, 64))
    _assert_same_bits(traced, eager)


def test_a_half_precision_convolution_weight_gradient_is_rounded_once(half):
    """Eager PyTorch on the CPU adds each sample's weight gradient to a bfloat16 running
    sum (a rounding per sample); here it is accumulated in float32 and rounded once, as
    `docs/modelzoo.md` records: equal to the float32 gradient of the same bfloat16 values,
    rounded."""
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(4, 32, 2, stride=2).bfloat16()
    x = torch.randn(4, 4, 8, 8).bfloat16()
    grad = torch.randn(4, 32, 4, 4).bfloat16()
    wide = torch.nn.Conv2d(4, 32, 2, stride=2)
    wide.load_state_dict({k: v.float() for k, v in conv.state_dict().items()})
    wide(x.float()).backward(grad.float())
    compiled = cstorch.compile(conv, cstorch.backend("CPU"))

    @cstorch.trace
    def step(x, g):
        compiled(x).backward(g)
        return conv.weight.grad

    _assert_same_bits(torch.as_tensor(step(x, grad)), wide.weight.grad.bfloat16())
