"""behaviour.json `amp_grad_scaler`, `amp_grad_scaler_after_amp_init` and
`amp_grad_scaler_half_dtypes`: GradScaler's stored settings and errors, and the recorded
runs (traced steps driven by a DataExecutor) with the same scales, skipped-step counts,
unclamped scales and finite flags.

Weights: the real package's CPU backend divides gradients by the scale without multiplying
the loss by it (its step sizes shrink by the scale; docs/compat.md), so the weights here
are compared with torch's SGD run eagerly on the same data, skipping the steps the scaler
skips, which is what loss scaling documents.
"""
import builtins
import json
import math
import os

import numpy as np
import pytest
import torch

import cerebras.pytorch as cstorch
from tests.conftest import SHARED

SCENARIOS = json.load(open(os.path.join(SHARED, "fixtures", "behaviour.json")))["scenarios"]
BEFORE_INIT = SCENARIOS["amp_grad_scaler"]
AFTER_INIT = SCENARIOS["amp_grad_scaler_after_amp_init"]


@pytest.fixture
def amp_state():
    """The amp settings of a fresh process, restored afterwards."""
    amp = cstorch.amp
    saved = amp.get_half_dtype_str(), amp.mixed_precision()
    amp.set_half_dtype("float16")
    amp.enable_mixed_precision(False)
    yield amp
    amp.set_half_dtype(saved[0])
    amp.enable_mixed_precision(saved[1])


def _value(v):
    """A fixture value in plain Python: tensors as (dtype, shape, values)."""
    if isinstance(v, dict) and v.get("tensor"):
        return ("tensor", v["dtype"], tuple(v["shape"]), v["values"])
    return v


def _ours(v):
    if isinstance(v, torch.Tensor):
        return ("tensor", str(v.dtype), tuple(v.shape), v.reshape(-1).tolist())
    return v


def _read_defaults(scaler):
    return {"dynamic": scaler.dynamic, "get_scale()": scaler.get_scale(),
            "loss_is_scaled": scaler.loss_is_scaled,
            "steps_per_increase": scaler.steps_per_increase,
            "min_loss_scale": scaler.min_loss_scale, "max_loss_scale": scaler.max_loss_scale,
            "overflow_tolerance": scaler.overflow_tolerance,
            "state_dict()": scaler.state_dict(),
            "get_num_skipped_steps()": scaler.get_num_skipped_steps()}


@pytest.mark.parametrize("scenario", [BEFORE_INIT, AFTER_INIT], ids=["before", "after_init"])
def test_constructor_defaults_and_errors(scenario, amp_state):
    if scenario is AFTER_INIT:
        amp_state.init()
    cstorch.backend("CPU")
    for call, want in scenario["defaults"].items():
        if "error" in want:
            with pytest.raises(getattr(builtins, want["error"])) as info:
                eval(call, {"GradScaler": cstorch.amp.GradScaler})
            assert str(info.value) == want["message"], call
            continue
        got = _read_defaults(eval(call, {"GradScaler": cstorch.amp.GradScaler}))
        for key, value in want["value"].items():
            assert _ours(got[key]) == _value(value), f"{call}: {key}"
            if key == "get_scale()" and not isinstance(value, dict):
                assert type(got[key]) is float


def test_the_largest_scale_follows_the_half_dtype(amp_state):
    cstorch.backend("CPU")
    for dtype, want in SCENARIOS["amp_grad_scaler_half_dtypes"]["by_half_dtype"].items():
        amp_state.set_half_dtype(dtype)
        scaler = cstorch.amp.GradScaler(loss_scale="dynamic")
        assert _ours(scaler.get_scale()) == _value(want["get_scale()"]), dtype
        assert scaler.max_loss_scale == want["max_loss_scale"], dtype


def _x(s, inf_steps):
    if s in inf_steps:
        return torch.tensor([[math.inf, 1.0]])
    return torch.tensor([[math.cos(s), math.sin(s)]], dtype=torch.float32)


def _run(kwargs, inf_steps):
    """The recorded run: Linear(2, 1) from [[0.5, -0.25]], SGD(lr=0.1), a @cstorch.trace
    step calling cstorch.amp.optimizer_step, 6 batches through a DataExecutor."""
    cstorch.backend("CPU")
    model = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[0.5, -0.25]]))
    compiled = cstorch.compile(model)
    opt = cstorch.optim.SGD(model.parameters(), lr=0.1)
    scaler = cstorch.amp.GradScaler(**kwargs)
    y = torch.tensor([[0.5]])
    data = [(_x(s, inf_steps), y) for s in range(1, 7)]

    @cstorch.trace
    def step(x, y):
        loss = torch.nn.functional.mse_loss(compiled(x), y)
        cstorch.amp.optimizer_step(loss, opt, scaler)
        opt.zero_grad()
        return loss

    loader = cstorch.utils.data.DataLoader(lambda: torch.utils.data.DataLoader(data,
                                                                               batch_size=None))
    records = []
    for x, y in cstorch.utils.data.DataExecutor(loader, num_steps=6):
        step(x, y)
        records.append({"get_scale": _ours(scaler.get_scale()),
                        "get_num_skipped_steps": _ours(scaler.get_num_skipped_steps()),
                        "get_non_clamped_scale": _ours(scaler.get_non_clamped_scale()),
                        "isfinite_seen_by_optimizer": _ours(opt._amp_stash.isfinite),
                        "weight": model.weight.detach().reshape(-1).tolist()})
    assert step.captures == 1
    return records


def _torch_reference(inf_steps, skipped):
    """torch's SGD on the same data, the skipped steps left out."""
    model = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[0.5, -0.25]]))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    weights = []
    for s in range(1, 7):
        loss = torch.nn.functional.mse_loss(model(_x(s, inf_steps)), torch.tensor([[0.5]]))
        loss.backward()
        if s not in skipped:
            opt.step()
        opt.zero_grad()
        weights.append(model.weight.detach().reshape(-1).tolist())
    return weights


@pytest.mark.parametrize("name", list(AFTER_INIT["runs"]))
def test_recorded_runs(name, amp_state):
    run = AFTER_INIT["runs"][name]
    amp_state.init()
    got = _run(run["kwargs"], run["inf_steps"])
    want = run["steps"]
    assert len(got) == len(want) == 6
    for s, (g, w) in enumerate(zip(got, want), 1):
        for key in ("get_scale", "get_num_skipped_steps", "get_non_clamped_scale",
                    "isfinite_seen_by_optimizer"):
            assert g[key] == _value(w[key]), f"step {s}: {key}"
    skipped = {s for s, w in enumerate(want, 1)
               if _value(w["isfinite_seen_by_optimizer"]) is not None
               and _value(w["isfinite_seen_by_optimizer"])[3] == [False]}
    reference = _torch_reference(run["inf_steps"], skipped)
    np.testing.assert_allclose([g["weight"] for g in got], reference, rtol=1e-5, atol=1e-7)
    # A skipped step leaves the weight exactly as the step before left it, as recorded.
    for s in skipped:
        if s > 1:
            assert got[s - 1]["weight"] == got[s - 2]["weight"]


def test_without_amp_init_the_step_works(amp_state):
    """The real package raises AttributeError here (its bug, docs/compat.md); the run
    gives what it gives after cstorch.amp.init()."""
    run = BEFORE_INIT["runs"]["dynamic_init1024_spi2_inf_at_2"]
    assert run["run_error"]["error"] == "AttributeError"
    got = _run(run["kwargs"], run["inf_steps"])
    want = AFTER_INIT["runs"]["dynamic_init1024_spi2_inf_at_2"]["steps"]
    assert [g["get_scale"] for g in got] == [_value(w["get_scale"]) for w in want]
    assert [g["get_num_skipped_steps"] for g in got] == [
        _value(w["get_num_skipped_steps"]) for w in want]


@pytest.mark.parametrize("args, match", [
    ((torch.tensor(1.0), "opt", None), "grad_scaler must be a cstorch.amp.GradScaler, got "
                                       "NoneType; pass cstorch.amp.GradScaler()"),
    ((torch.tensor(1.0), None, "scaler"), "optimizer must be a cstorch.optim.Optimizer"),
    ((1.0, "opt", "scaler"), "loss must be the loss tensor, got float"),
])
def test_optimizer_step_names_the_wrong_argument(args, match, amp_state):
    """issue 33: optimizer_step(loss, opt, None) raised AttributeError on None."""
    cstorch.backend("CPU")
    model = torch.nn.Linear(2, 1)
    opt = cstorch.optim.SGD(model.parameters(), lr=0.1)
    scaler = cstorch.amp.GradScaler()
    fill = {"opt": opt, "scaler": scaler}
    args = [fill.get(a, a) if isinstance(a, str) else a for a in args]
    with pytest.raises(TypeError, match=match):
        cstorch.amp.optimizer_step(*args)
