"""Identical layers traced once (bridge.traced_once): the capture runs the first layer's
Python code only, and the program equals the one that tracing every layer gives, forward,
gradients and dropout masks included; layers it cannot copy are traced one by one."""
import copy
import logging
import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from bridge.capture import _CaptureMode
import cerebras.pytorch as cstorch
from tests.bridge.test_scan_blocks import VOCAB, Block, Model, _batches, _loss
from tests.models import rel_err

csx = cstorch.backends.csx


class Counted(Block):
    """A Block (whose softmax calls are counted by `traced_calls`)."""


@pytest.fixture
def traced_calls(monkeypatch):
    """How many softmax and linear calls the capture traced: a Block makes one softmax, an
    nn.Linear one linear, and a layer whose calls are answered from the first layer's
    reaches the capture with none."""
    seen = {"softmax": 0, "linear": 0}
    original = _CaptureMode.__torch_function__

    def counting(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in seen:
            seen[name] += 1
        return original(self, func, types, args, kwargs)
    monkeypatch.setattr(_CaptureMode, "__torch_function__", counting)
    return seen


def _train(model, once, batches):
    before = csx.performance.trace_blocks_once
    csx.performance.trace_blocks_once = once
    try:
        step = _adamw_step(model)
        losses = [float(step(b)) for b in batches]
    finally:
        csx.performance.trace_blocks_once = before
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def _adamw_step(model):
    """A traced AdamW training step of `model` on the CPU backend."""
    cstorch.backend("CPU")
    compiled = cstorch.compile(model)
    opt = cstorch.optim.AdamW(model.parameters(), lr=1e-2)

    @cstorch.trace
    def step(tokens):
        loss = _loss(compiled, tokens)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss
    return step


def _blocks(layers, p=0.0):
    return [Counted(p=p) for _ in range(layers)]


def _trains_as_eager(model, batches, step_loss):
    reference = copy.deepcopy(model)
    cstorch.backend("CPU")
    compiled = cstorch.compile(model)
    opt = cstorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)

    @cstorch.trace
    def step(x):
        loss = step_loss(compiled, x)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    for b in batches:
        got = float(step(b))
        expected = step_loss(reference, b)
        ref_opt.zero_grad()
        expected.backward()
        ref_opt.step()
        assert rel_err(got, float(expected.detach())) < 1e-5
    for name, value in reference.state_dict().items():
        assert rel_err(model.state_dict()[name], value) < 1e-4, name


def test_the_first_layer_is_traced_and_the_program_equals_tracing_every_layer(
        traced_calls):
    """Dropout on: both captures draw every layer's own masks in the same order, so three
    AdamW steps give the same losses and weights bit for bit; only the first layer's ops
    are traced while the step is captured once (3 layers: 1 softmax traced, not 3)."""
    torch.manual_seed(0)
    model = Model(blocks=_blocks(3, p=0.2))
    twin = copy.deepcopy(model)
    batches = _batches()
    once, once_state = _train(model, True, batches)
    traced_once = traced_calls["softmax"]
    traced_calls["softmax"] = 0
    every, every_state = _train(twin, False, batches)
    assert traced_once == 1 and traced_calls["softmax"] == 3
    assert once == every
    for name, value in once_state.items():
        assert torch.equal(value, every_state[name]), name


def test_layers_traced_once_are_lowered_as_calls_of_one_function(caplog):
    """Unlooped (scan_blocks off, the default), a run traced once is also lowered once: its
    StableHLO holds the layer's forward and its gradients as functions that every layer
    calls, and the INFO log says so (the values equal tracing every layer: the test
    above)."""
    torch.manual_seed(0)
    step = _adamw_step(Model(blocks=_blocks(3)))
    with caplog.at_level(logging.INFO, logger="bridge.scan"):
        float(step(_batches()[0]))
    (program,) = [p for ps in step.programs.values() for p in ps]
    calls = re.findall(r"call @(layer\w*)", program.compiled.lowered.as_text())
    assert len(calls) == 6 and len(set(calls)) < 6, calls   # 3 forward, 3 gradient
    for part in ("forward", "gradients"):
        assert f"the 3 layers of model.blocks[0:3] ({part}) are calls of one function" \
            in caplog.text


@pytest.mark.slow
def test_a_model_traced_once_trains_as_eager_pytorch(traced_calls):
    torch.manual_seed(1)
    _trains_as_eager(Model(blocks=_blocks(3)), _batches(), _loss)
    assert traced_calls["softmax"] == 1


class Numbered(Block):
    """A Block keeping its own index as a plain attribute, as transformers' attention layers
    keep `layer_idx`; with `scaled`, its output is scaled by it (the layers' calls differ)."""

    def __init__(self, index, scaled=False):
        super().__init__()
        self.layer_idx, self.scaled = index, scaled

    def forward(self, x):
        y = super().forward(x)
        return y * (1.0 + 0.1 * self.layer_idx) if self.scaled else y


def test_layers_differing_in_an_attribute_no_call_reads_are_traced_once(traced_calls):
    """Not a loop (its layers must be alike in every attribute), but traced once: the
    calls are checked one by one."""
    torch.manual_seed(5)
    _trains_as_eager(Model(blocks=[Numbered(k) for k in range(3)]), _batches(), _loss)
    assert traced_calls["softmax"] == 1


class Flagged(Block):
    """A Block taking a per-layer flag: the layers' calls differ."""

    def forward(self, x, scale=1.0):
        return super().forward(x) * scale


class FlaggedModel(Model):
    def forward(self, idx):
        x = self.tok(idx)
        for k, block in enumerate(self.blocks):
            x = block(x, scale=1.0 + 0.1 * k)
        return self.head(self.ln(x))


class Peeking(Block):
    """A Block keeping an intermediate that the model reads after the layers."""

    def forward(self, x):
        self.kept = x * 2
        return super().forward(x)


class PeekingModel(Model):
    def forward(self, idx):
        x = self.tok(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x + self.blocks[0].kept))


class Scaled(Block):
    """A Block holding a host tensor outside its parameters and buffers."""

    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return super().forward(x) * self.scale


class Normed(nn.Module):
    """A layer whose BatchNorm writes its running statistics in place."""

    def __init__(self):
        super().__init__()
        self.fc, self.norm = nn.Linear(8, 8), nn.BatchNorm1d(8)

    def forward(self, x):
        return self.norm(self.fc(x)).relu() + x


class Checkpointed(Block):
    """A Block whose activations are recomputed in the backward pass."""

    def __init__(self, reentrant):
        super().__init__()
        self.reentrant = reentrant

    def forward(self, x):
        return checkpoint(super().forward, x, use_reentrant=self.reentrant)


def _model(case):
    if case == "flag":
        return FlaggedModel(blocks=[Flagged() for _ in range(3)])
    if case == "attribute":
        return Model(blocks=[Numbered(k, scaled=True) for k in range(3)])
    if case == "peek":
        return PeekingModel(blocks=[Peeking() for _ in range(3)])
    if case == "host tensor":
        return Model(blocks=[Scaled(torch.full((16,), 1.0 + k / 4)) for k in range(3)])
    if case in ("checkpoint", "reentrant checkpoint"):
        return Model(blocks=[Checkpointed(case != "checkpoint") for _ in range(3)])
    return nn.Sequential(nn.Linear(8, 8), Normed(), Normed())


@pytest.mark.parametrize("case, why", [
    pytest.param("flag", "calls mul with other arguments than the first layer",
                 marks=pytest.mark.slow),
    ("attribute", "calls mul with other arguments than the first layer"),
    pytest.param("peek", "is read outside it", marks=pytest.mark.slow),
    pytest.param("host tensor", "calls mul with other arguments than the first layer",
                 marks=pytest.mark.slow),
    ("running statistics", "writes in place into its argument or its own tensor"),
    ("checkpoint", "runs under saved-tensor hooks"),
    pytest.param("reentrant checkpoint", "calls CheckpointFunction with other arguments",
                 marks=pytest.mark.slow),
])
def test_layers_that_cannot_be_copied_are_traced_one_by_one(case, why, caplog):
    """Each case is traced layer by layer, says why at INFO, and trains as eager does
    (a copy of the first layer's ops would compute another function: another flag or
    scale, a lost running-statistics update, a value it cannot give, a backward pass that
    runs the layer's Python again)."""
    torch.manual_seed(2)
    model = _model(case)
    if isinstance(model, nn.Sequential):
        batches, loss = [torch.randn(4, 8) for _ in range(3)], lambda n, x: n(x).pow(2).mean()
    else:
        batches, loss = _batches(), _loss
    with caplog.at_level(logging.INFO, logger="cstorch"):
        _trains_as_eager(model, batches, loss)   # running statistics included
    said = [r.getMessage() for r in caplog.records
            if "identical layers are traced one by one" in r.getMessage()]
    assert said and why in said[0], said


class Failing(Block):
    def forward(self, x):
        raise ValueError("the layer's own error")


def test_an_error_inside_a_layer_is_the_users_own():
    """The capture's marks around the layer are closed cleanly: the user's error reaches
    the caller as it was raised."""
    cstorch.backend("CPU")
    model = cstorch.compile(Model(blocks=[Failing() for _ in range(2)]))

    @cstorch.trace
    def step(tokens):
        return _loss(model, tokens)

    with pytest.raises(ValueError, match="the layer's own error"):
        step(_batches(1)[0])


def test_the_setting_is_part_of_the_program_key(traced_calls):
    """Turning trace_blocks_once off captures again, every layer traced."""
    torch.manual_seed(3)
    cstorch.backend("CPU")
    model = cstorch.compile(Model(blocks=_blocks(3)))

    @cstorch.trace
    def step(tokens):
        return F.cross_entropy(model(tokens[:, :-1]).reshape(-1, VOCAB),
                               tokens[:, 1:].reshape(-1))

    tokens = _batches(1)[0]
    before = csx.performance.trace_blocks_once
    try:
        first = float(step(tokens))
        assert traced_calls["softmax"] == 1
        csx.performance.trace_blocks_once = False
        second = float(step(tokens))
        assert traced_calls["softmax"] == 1 + 3
    finally:
        csx.performance.trace_blocks_once = before
    assert first == second


class Indexed(Block):
    """A Block told its index, as Model Zoo's decoder layers are, using it only in a name."""

    def forward(self, x, layer_idx=None):
        self.name = f"decoder_out_layer{layer_idx}"
        return super().forward(x)


class IndexedModel(Model):
    def forward(self, idx):
        x = self.tok(idx)
        for k, block in enumerate(self.blocks):
            x = block(x, layer_idx=k)
        return self.head(self.ln(x))


@pytest.mark.slow
def test_a_layer_index_that_changes_no_torch_call_is_traced_once(traced_calls):
    """Each layer's Python runs (its own name set, as eager sets it) while only the first
    layer's ops are traced; the steps equal eager PyTorch's."""
    torch.manual_seed(4)
    model = IndexedModel(blocks=[Indexed() for _ in range(3)])
    _trains_as_eager(model, _batches(), _loss)
    assert traced_calls["softmax"] == 1
    assert [b.name for b in model.blocks] == [f"decoder_out_layer{k}" for k in range(3)]


class TwiceModel(Model):
    """Every layer applied twice, in two passes (as DINO runs one encoder on two views),
    the second on the whole sequence or on a shorter one."""

    def __init__(self, shorter, **kwargs):
        super().__init__(**kwargs)
        self.shorter = shorter

    def forward(self, idx):
        x = self.tok(idx)
        for block in self.blocks:
            x = block(x)
        y = x[:, :-2] if self.shorter else x
        for block in self.blocks:
            y = block(y)
        return self.head(self.ln(y))


@pytest.mark.slow
@pytest.mark.parametrize("shorter", [False, True])
def test_layers_applied_twice_are_traced_once_per_shape(shorter, traced_calls):
    """The second pass's calls are copies of the first layer's too (1 softmax traced of
    6 layer calls). On a shorter sequence the second pass's first layer takes a strided
    view and its second layer a contiguous tensor: both are traced, the third is a copy
    (3 traced). The gradients of both passes are summed into each parameter as eager
    sums them."""
    torch.manual_seed(5)

    def loss(model, tokens):
        logits = model(tokens[:, :-1])
        t = logits.shape[1]
        return F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:t + 1].reshape(-1))
    _trains_as_eager(TwiceModel(shorter, blocks=_blocks(3)), _batches(), loss)
    assert traced_calls["softmax"] == (3 if shorter else 1)


def test_a_first_layer_taking_another_input_is_traced_and_the_second_copied(traced_calls):
    """In an nn.Sequential of identical layers on the raw input, the first layer's input
    has no gradient and the others' have one: the first and the second layers are traced,
    the rest are copies of the second (2 linear calls traced of 4)."""
    torch.manual_seed(6)
    model = nn.Sequential(*[nn.Linear(8, 8) for _ in range(4)])
    _trains_as_eager(model, [torch.randn(4, 8) for _ in range(3)],
                     lambda net, x: net(x).pow(2).mean())
    assert traced_calls["linear"] == 2


class GradModeReading(Block):
    """A Block whose Python looks at the grad mode it sets (a later layer's `no_grad`
    must take effect although its calls are not traced)."""

    def forward(self, x):
        with torch.no_grad():
            scale = 0.5 if not torch.is_grad_enabled() else 2.0
        return super().forward(x) * scale


@pytest.mark.slow
def test_a_layer_setting_the_grad_mode_is_traced_once(traced_calls):
    torch.manual_seed(7)
    _trains_as_eager(Model(blocks=[GradModeReading() for _ in range(3)]), _batches(), _loss)
    assert traced_calls["softmax"] == 1


class ScaleFn(torch.autograd.Function):
    """x * s with a hand-written gradient (as Model Zoo's rotary embedding has one)."""

    @staticmethod
    def forward(ctx, x, s):
        ctx.s = s
        return x * s

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.s, None


class OwnGradient(Block):
    def forward(self, x, s=0.5):
        return ScaleFn.apply(super().forward(x), s)


class OwnGradientModel(Model):
    def __init__(self, per_layer, **kwargs):
        super().__init__(**kwargs)
        self.per_layer = per_layer

    def forward(self, idx):
        x = self.tok(idx)
        for k, block in enumerate(self.blocks):
            x = block(x, s=0.5 + 0.25 * k if self.per_layer else 0.5)
        return self.head(self.ln(x))


@pytest.mark.parametrize("per_layer", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_an_autograd_function_in_a_layer_is_one_call(per_layer, traced_calls, caplog):
    """Its forward and backward are functions of its class and arguments: with the same
    arguments in every layer, the layers are copies (1 softmax traced); with a scale of
    each layer's own, they are traced one by one, the Function named. Both train as eager."""
    torch.manual_seed(8)
    model = OwnGradientModel(per_layer, blocks=[OwnGradient() for _ in range(3)])
    with caplog.at_level(logging.INFO, logger="cstorch"):
        _trains_as_eager(model, _batches(), _loss)
    said = [r.getMessage() for r in caplog.records if "traced one by one" in r.getMessage()]
    if per_layer:
        assert said and "calls ScaleFn with other arguments" in said[0], said
    else:
        assert traced_calls["softmax"] == 1 and not said
