"""behaviour.json's `schedulers` scenario, as its doc says it was run: every LR and
weight-decay case on its own SGD, constructed as written (the value right after construction
is 'initial'), then 25 steps of one `@cstorch.trace` step driven by a DataExecutor that calls
every case's opt.step() and sched.step(); after each step the scheduled value of every param
group is read in the loop body. Then get_last_value()/get_last_lr() and the state_dict()
keys and plain values; the classes of both modules (names, bases, signatures, abstract or
not) and the constructor errors.

CosineAnnealingWarmRestarts(WD) is compared over its first period only: the real package
holds it flat after that (the fixture notes record it), where this project restarts the
cosine as documented (docs/compat.md; tests/optim/test_scheduler_torch_reference.py checks
every period against torch)."""
import inspect
import json
import os
import re

import pytest
import torch

import cerebras.pytorch as cstorch
from cerebras.pytorch.utils.data import DataExecutor, DataLoader
from tests.conftest import SHARED

with open(os.path.join(SHARED, "fixtures", "behaviour.json")) as f:
    SCENARIO = json.load(f)["scenarios"]["schedulers"]
STEPS = SCENARIO["steps"]
MODULES = {"lr": cstorch.optim.lr_scheduler, "weight_decay": cstorch.optim.weight_decay_scheduler}
CASES = [(key, name) for key in ("lr", "weight_decay") for name in SCENARIO[key]]
RTOL = 1e-5


def _first_period_only(name):
    """How many of the 25 values to compare: a warm-restart case up to its first restart."""
    match = re.search(r"T_0=(\d+)", SCENARIO["lr"].get(name, SCENARIO["weight_decay"].get(name, {}))
                      .get("construct", ""))
    return int(match.group(1)) - 1 if name.startswith("CosineAnnealingWarmRestarts") else STEPS


def _build(key, name, params=None):
    """The case's optimizer and scheduler, made as its 'construct' says (on the parameters
    `params` yields, or fresh ones)."""
    params = params if params is not None else iter(
        [torch.nn.Parameter(torch.zeros(2)) for _ in range(2)])
    construct = SCENARIO[key][name]["construct"]
    if construct.startswith("two param groups"):
        literal, construct = construct.split(": ", 1)[1].split("; ", 1)
        groups = eval(literal, {"a": next(params), "b": next(params)})
    else:
        groups = [{"params": [next(params)]}]
    construct = construct.split(" (inner schedulers", 1)[0]
    opt = cstorch.optim.SGD(groups, lr=1.0)
    namespace = dict(vars(MODULES[key]), opt=opt)
    return opt, eval(construct, namespace)


def _values(opt, key):
    return [float(g[key]) for g in opt.param_groups]


def _close(actual, expected):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert abs(a - e) <= RTOL * abs(e) + 1e-7, (actual, expected)


def _plain(value):
    """A state_dict value as the fixture writes it."""
    if isinstance(value, torch.Tensor):
        return {"tensor": True, "dtype": str(value.dtype), "shape": list(value.shape),
                "values": value.flatten().tolist()}
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _assert_state_equal(actual, expected, where):
    """`actual` (a state_dict made plain) is the fixture's: the same keys in the same order,
    tensors of the same dtype and shape with values within float32 rounding."""
    if isinstance(expected, dict) and expected.get("tensor"):
        assert actual["dtype"] == expected["dtype"], where
        assert actual["shape"] == expected["shape"], where
        _close(actual["values"], expected["values"])
    elif isinstance(expected, dict):
        assert list(actual) == list(expected), where
        for k, e in expected.items():
            _assert_state_equal(actual[k], e, f"{where}.{k}")
    elif isinstance(expected, list):
        assert len(actual) == len(expected), where
        for i, (a, e) in enumerate(zip(actual, expected)):
            _assert_state_equal(a, e, f"{where}[{i}]")
    elif isinstance(expected, float):
        assert actual == pytest.approx(expected, rel=1e-6), where
    else:
        assert actual == expected and type(actual) is type(expected), where


@pytest.fixture(scope="module")
def run():
    """Every case in one traced step run by a DataExecutor, as the scenario ran them."""
    cstorch.backend("CPU")
    # Here a traced step's optimizer updates parameters of a compiled module (the real
    # package's CPU backend also took bare ones); two per case cover the two-group cases.
    model = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(2))
                                    for _ in range(2 * len(CASES))])
    cstorch.compile(model)
    params = iter(model)
    cases = {}
    for key, name in CASES:
        opt, sched = _build(key, name, params)
        cases[(key, name)] = (opt, sched, _values(opt, key), [])

    @cstorch.trace
    def step(batch):
        for opt, sched, _, _ in cases.values():
            opt.step()
            sched.step()
        return batch

    loader = DataLoader(lambda: [torch.zeros(1) for _ in range(STEPS)])
    for batch in DataExecutor(loader, num_steps=STEPS):
        step(batch)
        for (key, _), (opt, _, _, values) in cases.items():
            values.append(_values(opt, key))
    assert step.captures == 1
    return cases


@pytest.mark.parametrize("key, name", CASES)
def test_initial_and_every_step_inside_a_traced_step(run, key, name):
    case = SCENARIO[key][name]
    _, _, initial, values = run[(key, name)]
    _close(initial, case["initial"])
    n = _first_period_only(name)
    assert len(values) == STEPS
    for i in range(n):
        _close(values[i], case["values"][i])


@pytest.mark.parametrize("key, name", CASES)
def test_last_value_and_state_dict(run, key, name):
    case = SCENARIO[key][name]
    _, sched, _, values = run[(key, name)]
    _close(sched.get_last_value(), values[-1])
    if key == "lr":
        _close(sched.get_last_lr(), values[-1])
    state = sched.state_dict()
    assert list(state) == case["state_dict_keys"]
    expected = case["state_dict"]
    if name.startswith("CosineAnnealingWarmRestarts"):
        # The last value differs after the first period (see the module docstring).
        expected = dict(expected, _last_value=_plain(state["_last_value"]))
    else:
        _close(sched.get_last_value(), case["get_last_value"]["value"])
    _assert_state_equal(_plain(state), expected, name)


def test_a_state_dict_resumes_the_schedule():
    """load_state_dict() of the real format puts a fresh scheduler at the saved step."""
    cstorch.backend("CPU")
    opt, sched = _build("lr", "SequentialLR")
    for _ in range(7):
        sched.step()
    saved = sched.state_dict()
    other_opt, other = _build("lr", "SequentialLR")
    other.load_state_dict(saved)
    assert other.last_epoch == 7
    _close(_values(other_opt, "lr"), SCENARIO["lr"]["SequentialLR"]["values"][6])
    other.step()
    _close(_values(other_opt, "lr"), SCENARIO["lr"]["SequentialLR"]["values"][7])


def _tensors(value):
    """A fixture state_dict with its tensors rebuilt: what the real package saved."""
    if isinstance(value, dict) and value.get("tensor"):
        dtype = getattr(torch, value["dtype"].split(".")[1])
        return torch.tensor(value["values"], dtype=dtype).reshape(value["shape"])
    if isinstance(value, dict):
        return {k: _tensors(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_tensors(v) for v in value]
    return value


@pytest.mark.parametrize("key, name", [c for c in CASES
                                       if not c[1].startswith("CosineAnnealingWarmRestarts")])
def test_the_real_packages_state_dict_resumes_here(key, name):
    """A fresh scheduler loads the real package's state_dict after 25 steps: it is at step
    25 with the real package's value, and steps on as a run of 26 steps here does."""
    cstorch.backend("CPU")
    opt, sched = _build(key, name)
    sched.load_state_dict(_tensors(SCENARIO[key][name]["state_dict"]))
    assert sched.last_epoch == STEPS
    _close(_values(opt, key), SCENARIO[key][name]["values"][-1])
    sched.step()
    ref_opt, ref = _build(key, name)
    for _ in range(STEPS + 1):
        ref.step()
    _close(_values(opt, key), _values(ref_opt, key))


def _render(signature):
    """`(self, a: T = 1, ...)` without self and annotations, as the fixture's strings."""
    params = list(signature.parameters.values())[1:]
    return [(p.name, p.default) for p in params]


def _parse(text):
    """The fixture's signature string, as (name, default) pairs."""
    inner = text.strip()[1:-1]
    out, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
            continue
        depth += ch in "[(" and 1 or 0
        depth -= ch in "])" and 1 or 0
        cur += ch
    out.append(cur)
    pairs = []
    for item in out[1:]:
        item = item.strip()
        name = item.split(":")[0].split("=")[0].strip()
        default = inspect.Parameter.empty
        if "=" in item:
            default = eval(item.rsplit("=", 1)[1].strip())
        pairs.append((name, default))
    return pairs


@pytest.mark.parametrize("module, name", [(m, n) for m in SCENARIO["classes"]
                                          for n in SCENARIO["classes"][m]])
def test_classes_of_both_modules(module, name):
    """Every class the real modules hold: its own name, where it is defined, its bases,
    whether it is abstract, and its constructor's parameters and defaults."""
    info = SCENARIO["classes"][module][name]
    cls = getattr(getattr(cstorch.optim, module), name)
    assert cls.__name__ == info["defined_name"]
    defined_in = cls.__module__.split(".")[2]   # lr_scheduler's classes are one per file
    assert defined_in == info["defined_in"], (name, cls.__module__)
    assert [b.__name__ for b in cls.__bases__] == info["bases"]
    assert inspect.isabstract(cls) == info["abstract"]
    assert _render(inspect.signature(cls.__init__)) == _parse(info["signature"])


ERRORS = {
    "LambdaLR(opt, lambda epoch: 0.9 ** epoch)  # torch-style lr_lambda":
        lambda opt, m: m.LambdaLR(opt, lambda epoch: 0.9 ** epoch),
    "OneCycleLR(opt, initial_learning_rate=0.1, max_lr=1.0, final_lr=0.01)":
        lambda opt, m: m.OneCycleLR(opt, initial_learning_rate=0.1, max_lr=1.0, final_lr=0.01),
    "CyclicLR(opt, base_lr=0.1, max_lr=1.0, mode='bogus')":
        lambda opt, m: m.CyclicLR(opt, base_lr=0.1, max_lr=1.0, mode="bogus"),
    "OneCycleLR(opt, initial_learning_rate=0.1, max_lr=1.0, anneal_strategy='bogus')":
        lambda opt, m: m.OneCycleLR(opt, initial_learning_rate=0.1, max_lr=1.0,
                                    anneal_strategy="bogus"),
    "SequentialLR(opt, schedulers=[ConstantLR(opt, learning_rate=0.5)], milestones=[2.0])":
        lambda opt, m: m.SequentialLR(opt, schedulers=[m.ConstantLR(opt, learning_rate=0.5)],
                                      milestones=[2.0]),
    "CosineAnnealingWarmRestarts(opt, initial_learning_rate=1.0, T_0=3, T_mult=2)":
        lambda opt, m: m.CosineAnnealingWarmRestarts(opt, initial_learning_rate=1.0, T_0=3,
                                                     T_mult=2),
    "ConstantLR(torch.optim.SGD(...), learning_rate=0.5)  # a plain torch optimizer":
        lambda opt, m: m.ConstantLR(torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=1.0),
                                    learning_rate=0.5),
}


@pytest.mark.parametrize("what", list(SCENARIO["constructor_errors"]))
def test_constructor_errors(what):
    cstorch.backend("CPU")
    opt = cstorch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=1.0)
    expected = SCENARIO["constructor_errors"][what]
    make = ERRORS[what]
    if "error" in expected:
        with pytest.raises(getattr(__builtins__, expected["error"], None) or
                           {"TypeError": TypeError, "ValueError": ValueError}[expected["error"]]):
            make(opt, cstorch.optim.lr_scheduler)
    else:
        with pytest.warns(UserWarning, match="the first step\\(\\) will raise"):
            sched = make(opt, cstorch.optim.lr_scheduler)
        assert type(sched).__name__ == expected["value"]
        # Accepted, but never silently: the first step refuses the unknown mode.
        with pytest.raises(ValueError, match="bogus"):
            sched.step()
