"""A plain Python value the step reads (an attribute of a compiled module, a global or a
closure variable of the step), changed after the capture, reaches the program: the step is
captured again for the new value, as eager PyTorch would compute with it
(`cstorch.tracing.python_values`)."""
import copy
import dataclasses
import enum
import functools
import math
import types
import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import cerebras.pytorch as cstorch
from cstorch.tracing import python_values
from tests.models import rel_err, sgd_pair


class UserLinear(nn.Linear):
    """A model's own module: the values in its containers are watched (a library's
    module's containers are its bookkeeping)."""


class Scaled(nn.Module):
    """Reads plain attributes in forward: a float, a string choosing a host table, and a
    float made into a tensor inside the step."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Dropout(0.0), nn.Linear(8, 3))
        self.body[1].temperature = 2.0
        self.tables = {"a": torch.randn(3, generator=torch.Generator().manual_seed(7)),
                       "b": torch.randn(3, generator=torch.Generator().manual_seed(8))}
        self.mode = "a"
        self.gain = torch.randn(3, generator=torch.Generator().manual_seed(9))   # a plain tensor
        self.shift = 0.5
        self.steps_seen = 0   # kept by the training loop, never read by forward

    def forward(self, x):
        h = self.body[0](x)
        h = self.body[1](h / self.body[1].temperature)
        h = self.body[3](self.body[2](h))
        return h * self.tables[self.mode] * self.gain + torch.tensor(self.shift)


def _pair():
    torch.manual_seed(0)
    eager = Scaled()
    ours = copy.deepcopy(eager)
    ours.tables = eager.tables   # the same host tables: the step closes over them
    cstorch.backend("CPU")
    step, eager_step, _, _ = sgd_pair(eager, ours)
    return eager, ours, step, eager_step


def _set(modules, edit):
    for m in modules:
        edit(m)


def _batch(i):
    g = torch.Generator().manual_seed(100 + i)
    return torch.randn(4, 5, generator=g), torch.randn(4, 3, generator=g)


def _same_weights(eager, ours):
    return max(rel_err(p, q) for p, q in zip(ours.state_dict().values(),
                                             eager.state_dict().values())
               if p.dtype.is_floating_point)


_NEW_GAIN = torch.randn(3, generator=torch.Generator().manual_seed(10))


@pytest.mark.parametrize("edit", [
    lambda m: setattr(m.body[1], "temperature", 5.0),
    lambda m: setattr(m, "mode", "b"),
    lambda m: setattr(m, "shift", -1.5),
    lambda m: setattr(m, "gain", _NEW_GAIN),
], ids=["float-in-forward", "string-choosing-a-host-table", "float-made-a-tensor-in-the-step",
        "tensor-rebound"])
def test_an_attribute_changed_after_the_capture_reaches_the_program(edit):
    eager, ours, step, eager_step = _pair()
    for i in range(2):
        assert rel_err(float(step(*_batch(i))), eager_step(*_batch(i))) < 1e-5
    _set((eager, ours), edit)
    for i in range(2, 5):
        assert rel_err(float(step(*_batch(i))), eager_step(*_batch(i))) < 1e-5
    assert _same_weights(eager, ours) < 1e-4
    assert step.captures == 2
    assert len(step.recaptures) == 1 and "changed from" in step.recaptures[0][0]


def test_a_value_seen_before_takes_its_program_again():
    eager, ours, step, eager_step = _pair()
    temperatures = [2.0, 5.0, 2.0, 5.0, 2.0]
    for i, t in enumerate(temperatures):
        _set((eager, ours), lambda m: setattr(m.body[1], "temperature", t))  # noqa: B023 (applied within this iteration)
        assert rel_err(float(step(*_batch(i))), eager_step(*_batch(i))) < 1e-5
    assert step.captures == 2
    assert step.recaptures == [["model.body.1.temperature changed from 2.0 to 5.0"]]
    assert _same_weights(eager, ours) < 1e-4


def test_a_tensor_made_from_an_attribute_is_compared_by_value():
    # `torch.tensor(self.shift)` leaves the graph's code the same for every value: only the
    # constant it makes differs, so the program must not stop watching `shift`.
    eager, ours, step, eager_step = _pair()
    for i, shift in enumerate([0.5, -1.5, 3.0, -1.5, 0.25]):
        _set((eager, ours), lambda m: setattr(m, "shift", shift))  # noqa: B023 (applied within this iteration)
        assert rel_err(float(step(*_batch(i))), eager_step(*_batch(i))) < 1e-5
    assert step.captures == 4


def test_an_attribute_the_step_does_not_read_costs_one_capture():
    eager, ours, step, eager_step = _pair()
    for i in range(6):
        ours.steps_seen = eager.steps_seen = i + 1
        assert rel_err(float(step(*_batch(i))), eager_step(*_batch(i))) < 1e-5
    # Captured again for the first new value, which left the program the same: from then
    # on `steps_seen` is not watched.
    assert step.captures == 2
    assert step.recaptures == []
    assert _same_weights(eager, ours) < 1e-4


def test_an_attribute_that_keeps_changing_the_program_warns():
    eager, ours, step, eager_step = _pair()
    step(*_batch(0))
    eager_step(*_batch(0))
    for i, t in enumerate([3.0, 4.0], start=1):
        _set((eager, ours), lambda m: setattr(m.body[1], "temperature", t))  # noqa: B023 (applied within this iteration)
        step(*_batch(i))
        eager_step(*_batch(i))
    _set((eager, ours), lambda m: setattr(m.body[1], "temperature", 6.0))
    with pytest.warns(UserWarning, match=r"model\.body\.1\.temperature has changed the captured "
                                         r"program 3 times.*in a tensor") as caught:
        got = float(step(*_batch(3)))
    assert caught[0].filename == __file__   # the warning names the user's line
    assert rel_err(got, eager_step(*_batch(3))) < 1e-5


def test_retrace_every_iteration_needs_no_watch():
    eager, ours, step, eager_step = _pair()
    cstorch.backends.csx.debug.retrace_every_iteration = True
    try:
        for i, t in enumerate([2.0, 5.0]):
            _set((eager, ours), lambda m: setattr(m.body[1], "temperature", t))  # noqa: B023 (applied within this iteration)
            assert rel_err(float(step(*_batch(i))), eager_step(*_batch(i))) < 1e-5
    finally:
        cstorch.backends.csx.debug.retrace_every_iteration = False


def test_plain_values_are_compared_by_type_and_nan_equals_nan():
    assert not python_values.same(1, True) and not python_values.same(1, 1.0)
    assert python_values.same(math.nan, float("nan"))
    assert python_values.same((1, "a", (2.0,)), (1, "a", (2.0,)))
    assert not python_values.same((1, 2), (1, 2.0))
    t = torch.ones(2)
    assert python_values.same((t, 1), (t, 1)) and not python_values.same(t, t.clone())
    assert python_values.describe((t,)) == "(a tensor of shape (2,),)"
    module = UserLinear(2, 2)
    module.flag, module.table = True, [1, 2]   # a list is watched item by item
    watched = python_values.module_attributes([("m", module)])
    assert {w[1] for w in watched} == {"m.in_features", "m.out_features", "m.flag",
                                       "m.table[0]", "m.table[1]"}
    module.table.append(3)   # a longer list: the items seen are still there, unchanged
    assert python_values.first_change(watched) is None
    module.table.pop(0)
    assert python_values.first_change(watched) == ("m.table[0]", 1, 2)
    module.table[:] = [1, 2]
    module.flag = False
    assert python_values.first_change(watched) == ("m.flag", True, False)
    del module.flag
    name, _, now = python_values.first_change(watched)
    assert name == "m.flag" and python_values.describe(now) == "(deleted)"


def test_a_numpy_scalar_attribute_reaches_the_program():
    """`np.float64` is not `float` (nor `np.int64` an `int`): such attributes were not
    watched, and a changed value silently kept the old program."""
    model, eager, compiled = _compiled_pair(lambda: nn.Linear(5, 3), 5)

    @cstorch.trace
    def step(x):
        return (compiled(x) / float(model.temperature) * int(model.repeats)).sum()

    x = _batch(0)[0]
    for temperature, repeats in [(2.0, 3), (5.0, 3), (5.0, 7), (2.0, 3)]:
        for m in (model, eager):
            m.temperature, m.repeats = np.float64(temperature), np.int64(repeats)
        with torch.no_grad():
            want = float((eager(x) / temperature * repeats).sum())
            assert rel_err(float(step(x)), want) < 1e-5
    assert step.captures == 3
    assert step.recaptures[0] == ["model.temperature changed from np.float64(2.0) to "
                                  "np.float64(5.0)"]
    assert python_values.same(np.float32(1), np.float32(1))
    assert not python_values.same(np.float32(1), np.float64(1))


class Kind(enum.Enum):
    DOUBLE = 2
    TRIPLE = 3


class Switched(nn.Module):
    """Chooses by an enum member and calls a function held as an attribute."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(5, 3)
        self.kind = Kind.DOUBLE
        self.act = torch.relu

    def forward(self, x):
        h = self.act(self.linear(x))
        return h * 2 if self.kind is Kind.DOUBLE else h * 3


def OUTER(h):   # a global function the step calls, rebound below
    return h.sum()


def test_an_enum_member_and_a_function_attribute_or_global_reach_the_program():
    """Enum members were not plain values and functions were not watched at all: a
    changed mode, `self.act = torch.tanh` or a rebound global function silently kept the
    old program."""
    global OUTER
    model, eager, compiled = _compiled_pair(Switched, 6)

    @cstorch.trace
    def step(x):
        return OUTER(compiled(x))

    x = _batch(0)[0]
    original = OUTER
    changes = [lambda m: None, lambda m: setattr(m, "kind", Kind.TRIPLE),
               lambda m: setattr(m, "act", torch.tanh)]
    try:
        for change in changes:
            change(model)
            change(eager)
            with torch.no_grad():
                assert rel_err(float(step(x)), float(eager(x).sum())) < 1e-5
        OUTER = lambda h: h.abs().sum()   # noqa: E731
        with torch.no_grad():
            assert rel_err(float(step(x)), float(eager(x).abs().sum())) < 1e-5
    finally:
        OUTER = original
    assert step.captures == 4
    assert step.recaptures[:2] == [
        ["model.kind changed from <Kind.DOUBLE: 2> to <Kind.TRIPLE: 3>"],
        ["model.act changed from the function relu to the function tanh"]]
    assert step.recaptures[2][0].startswith(f"global OUTER of {__name__} changed from the "
                                            f"function OUTER to the function ")


def test_host_tables_of_equal_values_are_told_apart():
    # Two tables equal at the capture: choosing the other one leaves the program's values
    # the same, but it closes over another tensor, whose later writes must be seen.
    eager, ours, step, eager_step = _pair()
    eager.tables["b"] = eager.tables["a"].clone()
    step(*_batch(0))
    eager_step(*_batch(0))
    _set((eager, ours), lambda m: setattr(m, "mode", "b"))
    assert rel_err(float(step(*_batch(1))), eager_step(*_batch(1))) < 1e-5
    _set((eager, ours), lambda m: setattr(m, "mode", "a"))
    eager.tables["a"].mul_(-2.0)
    with pytest.warns(UserWarning, match="closes over"):
        got = float(step(*_batch(2)))
    assert rel_err(got, eager_step(*_batch(2))) < 1e-5


SCALE = 2.0


def _scaled(h):
    return h * SCALE   # a helper the step calls by name: its globals are watched too


def _compiled_pair(make, seed):
    """(model, its eager copy, the compiled model) of `make()` under `seed`, on a new CPU
    backend."""
    torch.manual_seed(seed)
    model = make()
    eager = copy.deepcopy(model)
    cstorch.backend("CPU")
    return model, eager, cstorch.compile(model)


def _linear_pair(seed):
    _, eager, compiled = _compiled_pair(lambda: nn.Linear(5, 3), seed)
    return eager, compiled


def _decorated(fn):
    @functools.wraps(fn)
    def wrapper(*args):
        return fn(*args)
    return wrapper


@pytest.mark.parametrize("decorate", [False, True], ids=["plain", "under-a-decorator"])
def test_a_global_the_step_reads_through_a_helper_reaches_the_program(decorate):
    global SCALE
    eager, compiled = _linear_pair(1)

    def step(x):
        return _scaled(compiled(x)).sum()

    step = cstorch.trace(_decorated(step) if decorate else step)

    x = _batch(0)[0]
    try:
        for value in [2.0, -3.0, 2.0]:
            SCALE = value
            with torch.no_grad():
                assert rel_err(float(step(x)), float(_scaled(eager(x)).sum())) < 1e-5
    finally:
        SCALE = 2.0
    assert step.captures == 2
    assert step.recaptures == [[f"global SCALE of {__name__} changed from 2.0 to -3.0"]]


def test_a_closure_variable_of_the_step_reaches_the_program():
    eager, compiled = _linear_pair(2)
    factor = 1.5

    @cstorch.trace
    def step(x):
        return (compiled(x) * factor).sum()

    x = _batch(0)[0]
    for factor in [1.5, 4.0, -0.5]:
        with torch.no_grad():
            assert rel_err(float(step(x)), float((eager(x) * factor).sum())) < 1e-5
    assert step.captures == 3
    assert step.recaptures[0] == [
        "closure variable factor of test_a_closure_variable_of_the_step_reaches_the_program."
        "<locals>.step changed from 1.5 to 4.0"]


OFFSET = 0.25


class Offset(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(5, 3)

    def forward(self, x):
        return self.shifted(self.linear(x))

    def shifted(self, h):
        return h + OFFSET   # a global of the module's file, read by a method forward calls


def test_a_global_a_module_method_reads_reaches_the_program():
    global OFFSET
    model, eager, compiled = _compiled_pair(Offset, 3)

    @cstorch.trace
    def step(x):
        return compiled(x).sum()

    x = _batch(0)[0]
    try:
        for value in [0.25, 7.0]:
            OFFSET = value
            with torch.no_grad():
                assert rel_err(float(step(x)), float(eager(x).sum())) < 1e-5
    finally:
        OFFSET = 0.25
    assert step.captures == 2


L1_SHARE = 0.25


class MixedLoss(nn.Module):
    """A loss module the step holds but does not compile: a torch loss inside it, and a
    global read by its own method."""

    def __init__(self):
        super().__init__()
        self.huber = nn.HuberLoss(delta=1.0)

    def forward(self, out, target):
        return self.huber(out, target) + self.l1_part(out, target)

    def l1_part(self, out, target):
        return L1_SHARE * (out - target).abs().mean()


@pytest.mark.parametrize("edit", ["attribute-of-its-submodule", "global-its-method-reads"])
def test_an_uncompiled_loss_module_of_the_step_reaches_the_program(edit):
    global L1_SHARE
    model, eager, compiled = _compiled_pair(lambda: nn.Linear(5, 3), 4)
    loss_fn, eager_loss_fn = MixedLoss(), MixedLoss()

    @cstorch.trace
    def step(x, y):
        return loss_fn(compiled(x), y)

    try:
        for i in range(4):
            if i == 2:
                if edit == "global-its-method-reads":
                    L1_SHARE = 3.0
                else:
                    loss_fn.huber.delta = eager_loss_fn.huber.delta = 0.1
            x, y = _batch(i)
            y = y * 4   # residuals beyond both deltas
            with torch.no_grad():
                assert rel_err(float(step(x, y)), float(eager_loss_fn(eager(x), y))) < 1e-5
    finally:
        L1_SHARE = 0.25
    assert step.captures == 2
    changed = (f"global L1_SHARE of {__name__} changed from 0.25 to 3.0"
               if edit == "global-its-method-reads" else
               "loss_fn.huber.delta changed from 1.0 to 0.1")
    assert step.recaptures == [[changed]]


class PathConfig:
    """A plain config object, as models keep their settings."""

    def __init__(self):
        self.use_path_b = False
        self.extra = {"scale": 1.0, "bias_terms": [0.0, 0.5]}


@dataclasses.dataclass
class Settings:
    gain: float = 1.0


@dataclasses.dataclass(slots=True)
class SlotSettings:
    shift: float = 0.0


class TwoPaths(nn.Module):
    """Chooses its path and scales by values held in a config object, a dataclass and a
    dict, never by its own plain attributes."""

    def __init__(self, cfg, settings):
        super().__init__()
        self.cfg, self.settings, self.slots = cfg, settings, SlotSettings()
        self.a, self.b = nn.Linear(5, 3), nn.Linear(5, 3)

    def forward(self, x):
        out = self.b(x) if self.cfg.use_path_b else self.a(x)
        out = out * self.cfg.extra["scale"] + self.cfg.extra["bias_terms"][1]
        return out * self.settings.gain + self.slots.shift


STEP_CONFIG = types.SimpleNamespace(weight=1.0)


EDITS = {
    "config-object-attribute": lambda m: setattr(m.cfg, "use_path_b", True),
    "dict-in-a-config-object": lambda m: m.cfg.extra.__setitem__("scale", 3.0),
    "list-in-a-dict": lambda m: m.cfg.extra["bias_terms"].__setitem__(1, -2.0),
    "dataclass-field": lambda m: setattr(m.settings, "gain", 0.5),
    "slots-dataclass-field": lambda m: setattr(m.slots, "shift", 4.0),
    "namespace-global-of-the-step": lambda m: setattr(STEP_CONFIG, "weight", 2.5),
}


@pytest.mark.parametrize("edit", list(EDITS))
def test_a_value_inside_an_object_the_model_holds_reaches_the_program(edit):
    """Toggled between steps, a flag in `self.cfg` reused the old program (loss 14% off)."""
    torch.manual_seed(11)
    eager = TwoPaths(PathConfig(), Settings())
    ours = copy.deepcopy(eager)
    cstorch.backend("CPU")
    compiled = cstorch.compile(ours)

    @cstorch.trace
    def step(x, y):
        return F.mse_loss(compiled(x), y) * STEP_CONFIG.weight

    try:
        for i in range(4):
            if i == 2:
                EDITS[edit](eager)
                if edit != "namespace-global-of-the-step":
                    EDITS[edit](ours)
            x, y = _batch(i)
            with torch.no_grad():
                want = F.mse_loss(eager(x), y) * STEP_CONFIG.weight
                assert rel_err(float(step(x, y)), float(want)) < 1e-5
    finally:
        STEP_CONFIG.weight = 1.0
    assert step.captures == 2
    assert "changed from" in step.recaptures[0][0]


class Opaque:
    __slots__ = ()


def test_an_object_that_cannot_be_looked_into_warns_once_naming_it():
    model = UserLinear(5, 3)
    model.helper = Opaque()   # no __dict__ and no slots to watch
    cstorch.backend("CPU")
    compiled = cstorch.compile(model)

    @cstorch.trace
    def step(x):
        return compiled(x).sum()

    with pytest.warns(UserWarning, match=r"model\.helper holds a Opaque.*cannot be watched"):
        step(torch.ones(2, 5))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        step(torch.ones(2, 5))
        step(torch.ones(3, 5))   # captured again: no second warning
