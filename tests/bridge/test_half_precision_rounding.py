"""Half-precision ops round where eager PyTorch rounds: a linear layer or a convolution adds
its bias to the float32 accumulator and rounds once (a transposed convolution rounds as the
kernel torch picks for it does), and XLA keeps every rounding the program asks for (with its excess
precision on, an op reading a half-precision result widened back to float32 saw the
unrounded value). Compared bit for bit with eager torch under `cstorch.amp.autocast`."""
import jax.numpy as jnp
import pytest
import torch

import bridge
import bridge.ops.conv
import cerebras.pytorch as cstorch


@pytest.fixture
def half():
    before = cstorch.amp.get_half_dtype_str(), cstorch.amp.mixed_precision()
    yield lambda name: cstorch.amp.set_half_dtype(name)
    cstorch.amp.set_half_dtype(before[0])
    cstorch.amp.enable_mixed_precision(before[1])   # set_half_dtype switched it on


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


@pytest.fixture
def kernel_choice(monkeypatch):
    """Set the kernel eager torch would pick for a transposed convolution (None: its own
    choice on this CPU)."""
    def choose(backend):
        if backend is not None:
            monkeypatch.setattr(torch._C, "_select_conv_backend", lambda *args: backend)
        bridge.ops.conv._transposed_rounds_once.cache_clear()
    yield choose
    bridge.ops.conv._transposed_rounds_once.cache_clear()


@pytest.mark.parametrize("plain_kernel", [False, True])
def test_a_transposed_convolution_rounds_as_the_kernel_torch_picks_does(
        half, kernel_choice, plain_kernel):
    """oneDNN's kernel (AVX-512 CPUs) adds the bias before rounding once; the plain kernel,
    picked on other CPUs, rounds the product, then adds. Both are checked on any CPU
    against the two roundings computed in float32 by torch."""
    half("bfloat16")
    kernel_choice(torch._C._ConvBackend.SlowTranspose2d if plain_kernel else None)
    if not plain_kernel and not bridge.ops.conv._transposed_rounds_once(
            (4, 16, 8, 8), (16, 8, 2, 2), jnp.dtype(jnp.bfloat16), (2, 2), (0, 0), (1, 1), (0, 0), 1):
        pytest.skip("torch picks the plain kernel on this CPU: the other case covers it")
    torch.manual_seed(0)
    conv = torch.nn.ConvTranspose2d(16, 8, 2, stride=2)
    x = torch.randn(4, 16, 8, 8)
    wide = [t.bfloat16().float() for t in (x, conv.weight, conv.bias)]
    product = torch.nn.functional.conv_transpose2d(wide[0], wide[1], None, stride=2)
    if plain_kernel:
        product = product.bfloat16().float()
    want = (product + wide[2][None, :, None, None]).bfloat16()
    traced, _ = _traced_and_eager(conv, x)
    _assert_same_bits(traced, want, ties=0.005)


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


def _captured_and_eager(fn, *inputs):
    gm = bridge.capture(fn, list(inputs))
    got = bridge.lower(gm)(*[bridge.tensor_to_jax(t) for t in inputs])
    return [bridge.jax_to_tensor(g) for g in got], [w.detach() for w in fn(*inputs)]


def _softmax_and_gradient(x, g):
    x = x.detach().requires_grad_(True)
    y = torch.softmax(x, -1)
    return [y, torch.autograd.grad(y, x, g)[0]]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("fn", [
    _softmax_and_gradient,
    lambda x, g: [torch.sigmoid(x), torch.tanh(x), torch.sin(x), torch.reciprocal(x)],
    lambda x, g: [x.cumsum(-1)],
], ids=["softmax", "pointwise", "cumsum"])
def test_16_bit_floats_are_computed_in_float32_and_rounded_once(dtype, fn):
    """As ATen's CPU kernels do: the same ops written on float16 directly differed in 30%
    (sigmoid), 55% (softmax) and 62% (cumsum) of the elements."""
    torch.manual_seed(0)
    x, g = torch.randn(64, 32).to(dtype), torch.randn(64, 32).to(dtype)
    for traced, eager in zip(*_captured_and_eager(fn, x, g)):
        _assert_same_bits(traced, eager, ties=0.002)


class _HalfActivationsFloat32Weights(torch.nn.Module):
    """Model Zoo's mixture-of-experts router under `cstorch.use_cs()`: half activations
    through a layer whose weights stay float32."""

    def __init__(self):
        super().__init__()
        self.up, self.gate = torch.nn.Linear(16, 16), torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.gate(self.up(x).to(torch.float16)).float().softmax(-1)


def test_a_csx_step_takes_half_by_float32_products_in_the_half_dtype(monkeypatch, capsys):
    # level 0: float32 products in float32, as the eager reference computes them
    monkeypatch.setattr(cstorch.backends.csx.precision, "optimization_level", 0)
    torch.manual_seed(0)
    model = _HalfActivationsFloat32Weights()
    reference = _HalfActivationsFloat32Weights()
    reference.load_state_dict(model.state_dict())
    x, target = torch.randn(8, 16), torch.randn(8, 4)

    with pytest.raises(RuntimeError, match="same dtype"):   # eager PyTorch refuses it
        reference(x)

    # The reference: eager, the float32 operands of the half product rounded by hand.
    gate = reference.gate
    gate.forward = lambda h: torch.nn.functional.linear(h, gate.weight.half(), gate.bias.half())
    eager_opt = torch.optim.SGD(reference.parameters(), lr=0.5)

    backend = cstorch.backend("CSX")
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.5)

    @cstorch.trace
    def step(x, target):
        loss = ((compiled(x) - target) ** 2).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    for _ in range(3):
        loss = float(step(x, target))
        eager_loss = ((reference(x) - target) ** 2).sum()
        eager_opt.zero_grad()
        eager_loss.backward()
        eager_opt.step()
        assert abs(loss - eager_loss.item()) <= 1e-5 * abs(eager_loss.item())
    for name, p in reference.named_parameters():
        torch.testing.assert_close(model.state_dict()[name], p.detach(), rtol=1e-5, atol=1e-6)
    # eager would have refused: the run says what it did instead
    assert "multiplies half-precision tensors with float32 ones (linear)" in \
        capsys.readouterr().err


def test_a_cpu_step_refuses_half_by_float32_products_as_eager_does():
    model = _HalfActivationsFloat32Weights()
    compiled = cstorch.compile(model, cstorch.backend("CPU"))

    @cstorch.trace
    def step(x):
        return compiled(x)

    with pytest.raises(RuntimeError, match="same dtype"):
        step(torch.randn(8, 16))
