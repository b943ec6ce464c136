"""Schedules whose meaning torch's own schedulers share, checked step by step against
torch.optim.lr_scheduler run on a plain torch optimizer (an independent computation), and
the recorded values of the real package where it departs from torch on purpose."""
import json
import os

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
    got = _ours(lambda opt: lr_sched.CyclicLR(opt, base_lr=0.13, max_lr=0.71, **kw), 30)
    ref = _torch(lambda opt: torch.optim.lr_scheduler.CyclicLR(
        opt, base_lr=0.13, max_lr=0.71, cycle_momentum=False, **kw), 0.13, 30)
    assert got == pytest.approx(ref, rel=1e-5, abs=1e-7)
