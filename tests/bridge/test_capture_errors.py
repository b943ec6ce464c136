"""Capture errors name the user's line (for a backward op: the forward op it differentiates)
and keep the user's frames in the traceback; in-place ops on tensors made inside the step
are captured like any other op."""
import copy
import inspect
import os
import traceback

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import bridge
import cerebras.pytorch as cstorch
from bridge.errors import CaptureError, DataDependentShapeError, TensorValueReadError

HERE = os.path.basename(__file__)


def line_of(fn, text):
    """The line number in this file of the line of `fn` that contains `text`."""
    lines, start = inspect.getsourcelines(fn)
    hits = [start + i for i, line in enumerate(lines) if text in line]
    assert len(hits) == 1, (text, hits)
    return hits[0]


def assert_names_line(error, fn, text, in_traceback=True):
    """The message names this file and the line of `fn` holding `text`, and (for errors
    raised while the step runs) the traceback still holds that frame."""
    line = line_of(fn, text)
    msg = str(error)
    assert f'{HERE}", line {line}' in msg, msg
    assert text in msg, msg
    if in_traceback:
        frames = traceback.extract_tb(error.__traceback__)
        assert any(f.filename == __file__ and f.lineno == line for f in frames), frames


@pytest.fixture
def backend():
    return cstorch.backend("CPU")


# --- a backward op without a lowering: the forward line it differentiates ----------------

class Pooled(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3)

    def forward(self, x):
        y = self.conv(x)
        return F.avg_pool2d(y, 2)


def test_missing_backward_lowering_names_the_forward_line(backend, monkeypatch):
    backward_op = torch.ops.aten.avg_pool2d_backward.default
    assert backward_op in bridge.LOWERINGS
    assert backward_op not in bridge.decompositions()  # nothing else would reach it
    monkeypatch.delitem(bridge.LOWERINGS, backward_op)
    model = cstorch.compile(Pooled())
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)

    @cstorch.trace
    def step(x):
        loss = model(x).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    with pytest.raises(bridge.LoweringError) as info:
        step(torch.randn(1, 1, 6, 6))
    msg = str(info.value)
    assert "aten::avg_pool2d_backward" in msg and "gradient of the forward op" in msg
    assert_names_line(info.value, Pooled.forward, "F.avg_pool2d(y, 2)", in_traceback=False)
    assert_names_line(info.value, step, "loss = model(x).sum()", in_traceback=False)
    assert "cstorch" + os.sep + "tracing" not in msg  # no internal frame stands for the user's


def test_missing_forward_lowering_in_a_traced_step_names_the_step_line(backend):
    @cstorch.trace
    def step(x):
        return torch.hash_tensor(x * 2)  # no lowering (a uint64 result)

    with pytest.raises(bridge.LoweringError) as info:
        step(torch.randn(3))
    assert "aten::hash_tensor" in str(info.value)
    assert_names_line(info.value, step, "torch.hash_tensor(x * 2)", in_traceback=False)
    assert "cstorch" + os.sep + "tracing" not in str(info.value)


# --- data-dependent shapes -----------------------------------------------------------

def nonzero_step(x):
    return torch.nonzero(x)


def mask_index_step(x):
    return x[x > 0]


def masked_select_step(x):
    return torch.masked_select(x, x > 0)


def unique_step(x):
    return torch.unique(x)


@pytest.mark.parametrize("fn, text, op", [
    (nonzero_step, "torch.nonzero(x)", "aten.nonzero"),
    (mask_index_step, "x[x > 0]", "boolean mask"),
    (masked_select_step, "torch.masked_select(x, x > 0)", "aten.masked_select"),
    (unique_step, "torch.unique(x)", "aten._unique2"),
])
def test_data_dependent_shape_names_op_line_and_static_forms(backend, fn, text, op):
    step = cstorch.trace(fn)
    with pytest.raises(DataDependentShapeError) as info:
        step(torch.randn(5))
    msg = str(info.value)
    assert op in msg and "depends on tensor values" in msg
    assert "torch.where(cond, a, b)" in msg and "ignore_index" in msg and "torch.topk" in msg
    assert_names_line(info.value, fn, text)
    assert info.value.__suppress_context__  # no fake-tensor internals chained below it


# --- value reads ---------------------------------------------------------------------

def item_step(x):
    return x * x.sum().item()


def print_step(x):
    print(x)
    return x


def if_step(x):
    if x.sum() > 0:
        return x
    return -x


def tolist_step(x):
    return x * len([v for v in x.tolist() if v > 0])


@pytest.mark.parametrize("fn, text, how", [
    (item_step, "x.sum().item()", "item"),
    (print_step, "print(x)", "__repr__"),
    (if_step, "if x.sum() > 0:", "__bool__"),
    (tolist_step, "x.tolist()", "tolist"),
])
def test_value_read_keeps_the_offending_line(backend, fn, text, how):
    step = cstorch.trace(fn)
    with pytest.raises(TensorValueReadError) as info:
        step(torch.randn(3))
    assert isinstance(info.value, RuntimeError)
    msg = str(info.value)
    assert f"value was read ({how})" in msg and "cstorch.step_closure" in msg
    assert_names_line(info.value, fn, text)
    assert "library code" not in msg   # the read is the user's own line


def test_value_read_in_library_code_names_that_line_too(backend):
    """torch.distributions checks its arguments on the host (`if not valid.all()`), which
    reads a tensor's value inside torch: the message names the user's line and the line of
    torch that reads."""
    model = cstorch.compile(nn.Sequential(nn.Linear(4, 4)))

    def sample_step(x):
        return torch.distributions.Normal(model(x), 1.0).log_prob(x).sum()

    with pytest.raises(TensorValueReadError) as info:
        cstorch.trace(sample_step)(torch.randn(8, 4))
    msg = str(info.value)
    assert_names_line(info.value, sample_step,
                      "return torch.distributions.Normal(model(x), 1.0).log_prob(x).sum()")
    library = msg.split("which led to this line of library code:\n")[1]
    assert os.path.join("torch", "distributions") in library


@pytest.mark.parametrize("draw", [
    lambda g: torch.rand(3, generator=g),
    lambda g: torch.empty(3).uniform_(generator=g),
    lambda g: torch.multinomial(torch.ones(4), 2, generator=g).float(),
    lambda g: torch.normal(torch.zeros(3), torch.ones(3), generator=g),
], ids=["rand", "uniform_", "multinomial", "normal"])
def test_an_explicit_generator_in_a_step_is_refused(backend, draw):
    """Some of these ops ran with the generator silently ignored, others failed for want
    of a lowering: the program's numbers come from the step's key, never from `g`."""
    g = torch.Generator().manual_seed(3)
    state = g.get_state()

    def random_step(x):
        return x + draw(g)

    with pytest.raises(CaptureError, match=r"was given a torch.Generator.*Leave generator= "
                                           r"out") as info:
        cstorch.trace(random_step)(torch.zeros(3))
    assert_names_line(info.value, random_step, "return x + draw(g)")
    assert torch.equal(g.get_state(), state)


# --- anomaly mode and torch's GradScaler -----------------------------------------------

def test_detect_anomaly_in_a_step_is_refused(backend):
    model = cstorch.compile(nn.Linear(3, 1))

    @cstorch.trace
    def step(x):
        with torch.autograd.detect_anomaly(check_nan=True):
            loss = model(x).sum()
            loss.backward()
        return loss

    with pytest.warns(UserWarning, match="Anomaly Detection"), \
            pytest.raises(CaptureError) as info:
        step(torch.randn(2, 3))
    assert "detect_anomaly" in str(info.value) and "torch.isnan" in str(info.value)
    assert_names_line(info.value, step, "loss.backward()")


def test_torch_grad_scaler_in_a_step_names_the_cstorch_class(backend):
    model = cstorch.compile(nn.Linear(3, 1))
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")

    @cstorch.trace
    def step(x):
        loss = model(x).sum()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        return loss

    with pytest.raises(RuntimeError) as info:
        step(torch.randn(2, 3))
    assert "cstorch.amp.GradScaler" in str(info.value)
    assert_names_line(info.value, step, "scaler.scale(loss).backward()")
    # The patch is gone once the capture ends.
    assert torch.amp.GradScaler.scale.__qualname__ == "GradScaler.scale"


# --- in-place ops -----------------------------------------------------------------------

def test_in_place_write_into_a_closure_tensor_is_refused(backend):
    total = torch.zeros(3)

    @cstorch.trace
    def step(x):
        total.add_(x)
        return x * 2

    with pytest.raises(CaptureError) as info:
        step(torch.randn(3))
    assert "writes in place" in str(info.value) and "clone()" in str(info.value)
    assert_names_line(info.value, step, "total.add_(x)")
    assert torch.equal(total, torch.zeros(3))


def in_place_on_new_tensors(x, constant, mask_constant):
    a = x.clone().mul_(2)
    b = torch.zeros(3).index_put_((torch.tensor([0, 2]),), x[:2])
    c = torch.ones(3).masked_fill_(x > 0, 5.0)
    d = constant.clone().mul_(2).add_(x)
    e = torch.zeros_like(mask_constant, dtype=x.dtype).masked_fill_(mask_constant, -1.0) + x
    f = torch.tensor([1.0, 2.0, 3.0]).mul_(x)
    g = x.clone()
    g[g > 0] = 0.0
    return a, b, c, d, e, f, g


def test_in_place_ops_on_tensors_made_in_the_step_match_eager(backend):
    constant = torch.randn(3)
    mask_constant = torch.tensor([True, False, True])

    @cstorch.trace
    def step(x):
        return in_place_on_new_tensors(x, constant, mask_constant)

    for _ in range(2):
        x = torch.randn(3)
        got = step(x)
        want = in_place_on_new_tensors(x, constant, mask_constant)
        for g, w in zip(got, want):
            torch.testing.assert_close(torch.as_tensor(g), w, rtol=1e-6, atol=1e-6)
    assert step.captures == 1


def test_transformer_layer_with_a_bool_padding_mask_trains_as_eager(backend):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    eager = copy.deepcopy(layer)
    model = cstorch.compile(layer)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
    eager_optimizer = torch.optim.SGD(eager.parameters(), lr=0.1)
    # A constant the step closes over: F._canonical_mask fills a tensor made from it in place.
    mask = torch.zeros(2, 5, dtype=torch.bool)
    mask[0, 3:] = True

    @cstorch.trace
    def step(x):
        loss = model(x, src_key_padding_mask=mask).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    for _ in range(2):
        x = torch.randn(2, 5, 8)
        loss = step(x)
        want = eager(x, src_key_padding_mask=mask).square().mean()
        eager_optimizer.zero_grad()
        want.backward()
        eager_optimizer.step()
        torch.testing.assert_close(torch.as_tensor(loss), want.detach(), rtol=1e-5, atol=1e-6)
    for (name, p), q in zip(layer.named_parameters(), eager.parameters()):
        torch.testing.assert_close(torch.as_tensor(p.detach()), q.detach(), rtol=1e-5, atol=1e-6,
                                   msg=name)


# --- calls eager PyTorch refuses: its exception and words, the user's line, a quiet stderr --

BAD_BATCHES = {
    "float64-features": lambda x, y: (x.double(), y),
    "float16-features": lambda x, y: (x.half(), y),
    "int32-class-targets": lambda x, y: (x, y.int()),
    "features-of-the-wrong-width": lambda x, y: (torch.randn(4, 6), y),
}


@pytest.mark.parametrize("bad", list(BAD_BATCHES))
def test_a_batch_eager_refuses_fails_at_capture_as_eager_fails(backend, bad, capfd):
    """These trained silently (promoted features, int32 targets read as classes) or failed
    with a meta kernel's words after a logged traceback on stderr."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))
    eager = copy.deepcopy(model)
    compiled = cstorch.compile(model)

    def train_step(x, y):
        return F.cross_entropy(compiled(x), y)

    x, y = BAD_BATCHES[bad](torch.randn(4, 5), torch.tensor([0, 2, 1, 2]))
    with pytest.raises(Exception) as expected:
        F.cross_entropy(eager(x), y)
    capfd.readouterr()
    with pytest.raises(Exception) as info:
        cstorch.trace(train_step)(x, y)
    assert type(info.value) is type(expected.value)
    assert str(info.value).split("\nIn the step, at:")[0] == str(expected.value)
    assert_names_line(info.value, train_step, "return F.cross_entropy(compiled(x), y)")
    assert capfd.readouterr().err == ""


def test_mixed_dtypes_under_autocast_are_left_to_autocast(backend):
    torch.manual_seed(1)
    model = nn.Linear(5, 3)
    eager = copy.deepcopy(model)
    compiled = cstorch.compile(model)
    x = torch.randn(4, 5, dtype=torch.bfloat16)   # autocast casts the float32 weight to it

    @cstorch.trace
    def autocast_step(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return compiled(x).float()

    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = eager(x).float()
    assert torch.allclose(autocast_step(x), want, rtol=1e-2, atol=1e-2)
