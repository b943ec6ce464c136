"""Schedules whose meaning torch's own schedulers share, checked step by step against
torch.optim.lr_scheduler run on a plain torch optimizer (an independent computation), and
the recorded values of the real package where it departs from torch on purpose."""
import json
import os
import warnings

import pytest
import torch

import cerebras.pytorch as cstorch
from tests.conftest import SHARED

with open(os.path.join(SHARED, "fixtures", "behaviour.json")) as f:
    CASES = json.load(f)["scenarios"]["schedulers"]["lr"]
lr_sched = cstorch.optim.lr_scheduler


def _ours(make, steps):
    cstorch.backend("CPU")
    opt = cstorch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=1.0)
    sched = make(opt)
    values = [float(opt.param_groups[0]["lr"])]
    for _ in range(steps):
        opt.step()
        sched.step()
        values.append(float(opt.param_groups[0]["lr"]))
    return values


def _torch(make, lr, steps):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=lr)
    sched = make(opt)
    values = [opt.param_groups[0]["lr"]]
    for _ in range(steps):
        opt.step()
        sched.step()
        values.append(opt.param_groups[0]["lr"])
    return values


@pytest.mark.parametrize("name", ["PolynomialLR_cycle", "LinearLR_cycle"])
def test_cycle_holds_the_end_rate_after_total_iters(name):
    """The real package's PolynomialLR/LinearLR(cycle=True) hold end_learning_rate after
    total_iters; a restart (0.0256 at step 7 for this PolynomialLR) is wrong."""
    case = CASES[name]
    kwargs = eval("dict(" + case["construct"].split("(opt, ", 1)[1])
    cls = getattr(lr_sched, name.split("_")[0])
    with pytest.warns(UserWarning, match=r"cycle=True\) holds the end value"):
        got = _ours(lambda opt: cls(opt, **kwargs), 25)
    expected = case["initial"] + [v[0] for v in case["values"]]
    assert got == pytest.approx(expected, rel=1e-5, abs=1e-7)
    end = kwargs["end_learning_rate"]
    assert got[kwargs["total_iters"]:] == pytest.approx([end] * (26 - kwargs["total_iters"]))


@pytest.mark.parametrize("mode, scale_mode", [("triangular2", "iterations"),
                                              ("triangular", "iterations"),
                                              ("exp_range", "cycle")])
def test_cyclic_builtin_modes_fix_their_scale_mode_as_torch_does(mode, scale_mode):
    """For the built-in modes the scale follows the cycle (triangular, triangular2) or the
    step (exp_range) whatever scale_mode says, as in torch."""
    kw = dict(step_size_up=3, step_size_down=2, mode=mode, gamma=0.93, scale_mode=scale_mode)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = _ours(lambda opt: lr_sched.CyclicLR(opt, base_lr=0.13, max_lr=0.71, **kw), 30)
    if mode != "exp_range":   # said when the user's scale_mode is not the one applied
        assert any("does not apply" in str(w.message) for w in caught)
    ref = _torch(lambda opt: torch.optim.lr_scheduler.CyclicLR(
        opt, base_lr=0.13, max_lr=0.71, cycle_momentum=False, **kw), 0.13, 30)
    assert got == pytest.approx(ref, rel=1e-5, abs=1e-7)


def _traced_ours(make, steps):
    """The values a schedule writes inside one `@cstorch.trace` step, step after step."""
    cstorch.backend("CPU")
    model = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(2))])
    cstorch.compile(model)
    opt = cstorch.optim.SGD(model.parameters(), lr=1.0, weight_decay=0.5)
    sched = make(opt)
    key = sched.param_group_key

    @cstorch.trace
    def step():
        opt.step()
        sched.step()
        return opt.param_groups[0][key] * 1

    values = [float(opt.param_groups[0][key])] + [float(step()) for _ in range(steps)]
    assert step.captures == 1
    return values


@pytest.mark.parametrize("T_0, eta_min", [(5, 0.0), (3, 0.013), (7, 0.05)])
def test_cosine_annealing_warm_restarts_restarts_every_period(T_0, eta_min):
    """What torch's CosineAnnealingWarmRestarts (T_mult=1) does, in every period: the real
    package holds the value flat after the first one (docs/compat.md)."""
    steps = 4 * T_0 + 2
    ref = _torch(lambda opt: torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(
        opt, T_0=T_0, eta_min=eta_min), 0.37, steps)
    lr = lambda opt: lr_sched.CosineAnnealingWarmRestarts(opt, 0.37, T_0, eta_min=eta_min)
    wd = lambda opt: cstorch.optim.weight_decay_scheduler.CosineAnnealingWarmRestartsWD(
        opt, initial_val=0.37, T_0=T_0, eta_min=eta_min)
    assert _ours(lr, steps) == pytest.approx(ref, rel=1e-5, abs=1e-7)
    assert _traced_ours(lr, steps) == pytest.approx(ref, rel=1e-5, abs=1e-7)
    assert _traced_ours(wd, steps) == pytest.approx(ref, rel=1e-5, abs=1e-7)
    # Restarted at the initial value at every multiple of T_0.
    assert [_ours(lr, steps)[k * T_0] for k in range(4)] == pytest.approx([0.37] * 4)


@pytest.mark.parametrize("T_mult", [2, 0, 1.5])
def test_cosine_annealing_warm_restarts_takes_only_t_mult_1(T_mult):
    cstorch.backend("CPU")
    opt = cstorch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=1.0)
    with pytest.raises(ValueError, match="Only supported default T_mult value: 1.0"):
        lr_sched.CosineAnnealingWarmRestarts(opt, 1.0, T_0=3, T_mult=T_mult)


@pytest.mark.parametrize("three_phase, strategy", [(False, "cos"), (True, "linear"),
                                                   (True, "cos"), (False, "linear")])
def test_one_cycle_matches_torch_up_to_total_steps(three_phase, strategy):
    """torch's OneCycleLR with max_lr / div_factor as the initial rate; its end rate is the
    initial rate / final_div_factor, as here."""
    kw = dict(total_steps=23, pct_start=0.25, final_div_factor=37.0, three_phase=three_phase,
              anneal_strategy=strategy)
    got = _ours(lambda opt: lr_sched.OneCycleLR(opt, 0.09, 0.81, **kw), 22)
    ref = _torch(lambda opt: torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=0.81, div_factor=9.0, cycle_momentum=False, **kw), 0.09, 22)
    assert got == pytest.approx(ref, rel=1e-4, abs=1e-7)


class _InverseTime(lr_sched.LambdaLR):
    """A LambdaLR with its own function of the step (the real package's extension point)."""

    def set_value_lambda(self):
        return lambda step: 1 / (1 + 0.7 * step)


def test_lambda_lr_with_its_own_function_matches_torch():
    """One function f: initial_learning_rate * f(t), as torch's LambdaLR(lr_lambda=f) on
    an optimizer whose lr is the initial rate; eagerly and inside a traced step."""
    ref = _torch(lambda opt: torch.optim.lr_scheduler.LambdaLR(
        opt, lambda t: 1 / (1 + 0.7 * t)), 0.23, 12)
    assert _ours(lambda opt: _InverseTime(opt, 0.23), 12) == pytest.approx(ref, rel=1e-6)
    assert _traced_ours(lambda opt: _InverseTime(opt, 0.23), 12) == pytest.approx(ref, rel=1e-6)


def test_lambda_lr_default_function_is_the_real_packages():
    """Without an override: initial ** 2 * (t / 30) * 0.95 ** t (behaviour.json's notes)."""
    got = _ours(lambda opt: lr_sched.LambdaLR(opt, initial_learning_rate=0.8), 9)
    assert got == pytest.approx([0.64 * t / 30 * 0.95 ** t for t in range(10)], rel=1e-6)
