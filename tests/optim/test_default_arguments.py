"""behaviour.json scenario `optimizers`: every optimizer built with its default arguments
(SGD and Adafactor with lr=0.01) on two parameters, stepped 5 times with the recorded
gradients, gives the real package's defaults, param groups, parameters after each step and
final state_dict (keys in order, dtypes, shapes, values), eagerly and in a traced step."""
import json
import math
import os

import pytest
import torch

import cerebras.pytorch as cstorch
from tests.conftest import SHARED

with open(os.path.join(SHARED, "fixtures", "behaviour.json")) as f:
    SCENARIO = json.load(f)["scenarios"]["optimizers"]
INPUTS = SCENARIO["inputs"]
CASES = SCENARIO["cases"]
STEPPED = [name for name, case in CASES.items() if "step_error" not in case]
RTOL = 1e-5


def optimizer_class(name):
    if name == "AdamBase":
        return cstorch.optim.AdamBase.AdamBase
    return getattr(cstorch.optim, name)


def initial_values():
    p0 = torch.tensor(INPUTS["p0_init"], dtype=torch.float32).reshape(3, 4)
    p1 = torch.tensor(INPUTS["p1_init"], dtype=torch.float32)
    return {"p0": p0, "p1": p1}


def grads(step):
    g = INPUTS["grads"][str(step)]
    return {"p0": torch.tensor(g["p0"], dtype=torch.float32).reshape(3, 4),
            "p1": torch.tensor(g["p1"], dtype=torch.float32)}


def plain(obj):
    """As the fixture wrote it: tuples are lists."""
    return json.loads(json.dumps(obj))


def close(actual, expected, rtol=RTOL):
    a = torch.as_tensor(actual, dtype=torch.float64).flatten()
    e = torch.as_tensor(expected, dtype=torch.float64).flatten()
    assert a.shape == e.shape
    err = ((a - e).abs() / e.abs().clamp_min(1e-6)).max().item() if a.numel() else 0.0
    assert err < rtol, (err, a.tolist(), e.tolist())


def check_state_dict(opt, case):
    sd = opt.state_dict()
    want = case["state_dict"]
    assert [str(k) for k in sd["state"]] == list(want["state"])
    for index, entries in want["state"].items():
        got = sd["state"][int(index)]
        assert list(got) == list(entries), index  # the keys, in the real package's order
        for key, rec in entries.items():
            value = got[key]
            assert isinstance(value, torch.Tensor) and str(value.dtype) == rec["dtype"]
            assert list(value.shape) == rec["shape"], key
            close(value, rec["values"])
    assert plain(sd["param_groups"]) == want["param_groups"]
    assert [list(g) for g in sd["param_groups"]] == [list(g) for g in want["param_groups"]]


def build(name, case, tensors):
    opt = optimizer_class(case["class"])(tensors, **case["kwargs"])
    # The recording read `opt.state[p]` of each parameter right after construction, which
    # gives a stateless rule's parameter (SGD's) its empty entry in the final state_dict.
    assert {str(i): sorted(opt.state[p]) for i, p in enumerate(tensors)} == \
        case["state_keys_at_construction"]
    return opt


def test_inputs_are_the_documented_formulas():
    p = initial_values()
    assert torch.equal(p["p0"].flatten(), torch.tensor(
        [0.5 * math.sin(k + 1) for k in range(12)], dtype=torch.float64).float())
    assert torch.equal(p["p1"], torch.tensor(
        [0.25 * math.cos(k + 1) for k in range(4)], dtype=torch.float64).float())
    for s in range(1, 6):
        g = grads(s)
        assert torch.equal(g["p0"].flatten(), torch.tensor(
            [math.cos(0.7 * k + 0.3 * s) for k in range(12)], dtype=torch.float64).float())


@pytest.mark.parametrize("name", list(CASES))
def test_construction_with_default_arguments(name):
    cstorch.backend("CPU")
    case = CASES[name]
    values = initial_values()
    params = [torch.nn.Parameter(values[k].clone()) for k in case["params"]]
    opt = build(name, case, params)
    assert plain(opt.defaults) == case["defaults"]
    assert list(opt.defaults) == list(case["defaults"])
    group = {k: v for k, v in opt.param_groups[0].items() if k != "params"}
    assert plain(group) == case["param_group_at_construction"]
    assert list(group) == list(case["param_group_at_construction"])


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if "ctor_without_lr" in c])
def test_lr_is_required(name):
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'lr'"):
        optimizer_class(name)([torch.nn.Parameter(torch.zeros(2))])


@pytest.mark.parametrize("name", STEPPED)
def test_five_eager_steps(name):
    cstorch.backend("CPU")
    case = CASES[name]
    values = initial_values()
    params = {k: torch.nn.Parameter(values[k].clone()) for k in case["params"]}
    opt = build(name, case, list(params.values()))
    for s, want in enumerate(case["params_after_step"], start=1):
        g = grads(s)
        for k, p in params.items():
            p.grad = g[k]
        opt.step()
        for k, p in params.items():
            close(p.detach(), want[k])
    check_state_dict(opt, case)


class TwoParams(torch.nn.Module):
    def __init__(self, values):
        super().__init__()
        self.p0 = torch.nn.Parameter(values["p0"].clone())
        self.p1 = torch.nn.Parameter(values["p1"].clone())

    def forward(self, g0, g1):
        return (self.p0 * g0).sum() + (self.p1 * g1).sum()


@pytest.mark.parametrize("name", STEPPED)
def test_five_traced_steps(name):
    """The same steps inside one captured `@cstorch.trace` step: a loss whose gradients are
    exactly the recorded ones (``sum(p * g)``)."""
    cstorch.backend("CPU")
    case = CASES[name]
    model = TwoParams(initial_values())
    compiled = cstorch.compile(model)
    opt = build(name, case, [model.p0, model.p1])

    @cstorch.trace
    def step(g0, g1):
        opt.zero_grad()
        loss = compiled(g0, g1)
        loss.backward()
        opt.step()
        return loss

    for s, want in enumerate(case["params_after_step"], start=1):
        g = grads(s)
        step(g["p0"], g["p1"])
        close(model.p0.detach(), want["p0"], rtol=1e-4)
        close(model.p1.detach(), want["p1"], rtol=1e-4)
    assert step.captures == 1
    sd = opt.state_dict()
    assert [list(sd["state"][i]) for i in range(2)] == \
        [list(case["state_dict"]["state"][str(i)]) for i in range(2)]
