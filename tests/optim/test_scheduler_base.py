"""cstorch.optim.scheduler (the base every schedule shares, generic over the param-group
key), the weight-decay schedules and ScalePerParamLR: inside one traced step (CPU backend)
they write the same values as eagerly, step by step, and the parameters follow."""
import inspect
import math

import pytest
import torch

import cerebras.pytorch as cstorch

RTOL = 1e-5
STEPS = 10
sched = cstorch.optim.scheduler
lr_sched = cstorch.optim.lr_scheduler
wd_sched = cstorch.optim.weight_decay_scheduler


class _Momentum:
    """A schedule of the param groups' momentum: the generic classes with another key, as
    the real package's abstract bases are meant to be extended."""

    @property
    def param_group_key(self):
        return "momentum"


class MomentumConstant(_Momentum, sched.ConstantScheduler):
    pass


class MomentumPiecewise(_Momentum, sched.PiecewiseConstantScheduler):
    pass


class MomentumSequential(_Momentum, sched.SequentialScheduler):
    pass


class MomentumChained(_Momentum, sched.ChainedScheduler):
    pass


class EpsConstant(sched.ConstantScheduler):
    @property
    def param_group_key(self):
        return "eps"


def _make(opt):
    """Schedules of three keys over three tagged groups: lr on every group (scaled per group),
    weight_decay per group, momentum on every group through the generic classes."""
    schedulers = [
        lr_sched.ScalePerParamLR(opt, lr_sched.CosineDecayLR(
            opt, initial_learning_rate=0.1, end_learning_rate=0.01, total_iters=STEPS)),
        wd_sched.CosineDecayWD(opt, initial_val=0.04, end_val=0.4, total_iters=8,
                               param_group_tags="a"),
        wd_sched.PiecewiseConstantWD(opt, vals=[0.0, 0.1, 0.2], milestones=[3, 6],
                                     param_group_tags={"b"}),
        wd_sched.SequentialWD(opt, [
            wd_sched.LinearWD(opt, initial_val=0.0, end_val=0.3, total_iters=4,
                              param_group_tags="c"),
            wd_sched.ExponentialWD(opt, initial_val=0.3, total_iters=2, decay_rate=0.5,
                                   param_group_tags="c")], [4], param_group_tags="c"),
        MomentumChained([
            MomentumPiecewise(opt, MomentumConstant, [0.9, 0.5, 0.1], [2, 5]),
            MomentumSequential(opt, [
                MomentumPiecewise(opt, MomentumConstant, [1.0], []),
                MomentumPiecewise(opt, MomentumConstant, [0.5, 1.0], [2])],
                milestones=[4])]),
    ]
    return schedulers


KEYS = ("lr", "weight_decay", "momentum")


def _params():
    g = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(4, 3, generator=g)) for _ in range(3)]


def _groups(params):
    return [{"params": [p], "tags": {tag}, "adjust_learning_rate": factor}
            for p, tag, factor in zip(params, "abc", (1.0, 0.5, 2.0))]


def _batches():
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(5, 3, generator=g), torch.randn(5, 4, generator=g))
            for _ in range(STEPS)]


def _eager():
    cstorch.backend("CPU")
    params = _params()
    opt = cstorch.optim.SGD(_groups(params), lr=0.1, momentum=0.9, weight_decay=0.01)
    schedulers = _make(opt)
    values, weights = [], []
    for x, y in _batches():
        values.append([[float(g[k]) for k in KEYS] for g in opt.param_groups])
        opt.zero_grad()
        sum(((x @ p.t() - y) ** 2).mean() for p in params).backward()
        opt.step()
        for s in schedulers:
            s.step()
        weights.append([p.detach().clone() for p in params])
    return values, weights, [s.last_epoch for s in schedulers]


def _traced():
    cstorch.backend("CPU")
    model = torch.nn.ParameterList(_params())
    compiled = cstorch.compile(model)
    opt = cstorch.optim.SGD(_groups(list(model)), lr=0.1, momentum=0.9, weight_decay=0.01)
    schedulers = _make(opt)

    @cstorch.trace
    def step(x, y):
        seen = [g[k] * 1 for g in opt.param_groups for k in KEYS]
        opt.zero_grad()
        sum(((x @ p.t() - y) ** 2).mean() for p in compiled.parameters()).backward()
        opt.step()
        for s in schedulers:
            s.step()
        return seen

    values, weights = [], []
    for x, y in _batches():
        seen = [float(v) for v in step(x, y)]
        values.append([seen[i:i + 3] for i in range(0, 9, 3)])
        weights.append([p.detach().clone() for p in model])
    assert step.captures == 1
    return values, weights, [s.last_epoch for s in schedulers]


@pytest.fixture(scope="module")
def runs():
    return _eager(), _traced()


def test_traced_values_and_parameters_equal_eager(runs):
    (values_e, weights_e, epochs_e), (values_t, weights_t, epochs_t) = runs
    for i in range(STEPS):
        for a, e in zip(values_t[i], values_e[i]):
            assert a == pytest.approx(e, rel=RTOL, abs=1e-7), i
        for a, e in zip(weights_t[i], weights_e[i]):
            torch.testing.assert_close(a, e, rtol=RTOL, atol=1e-6)
    assert epochs_e == epochs_t == [STEPS] * 5


def test_values_follow_their_formulas(runs):
    values = runs[0][0]
    for t in range(STEPS):
        (lr_a, wd_a, m_a), (lr_b, wd_b, m_b), (lr_c, wd_c, m_c) = values[t]
        lr = 0.01 + 0.09 * (1 + math.cos(math.pi * t / STEPS)) / 2
        assert (lr_a, lr_b, lr_c) == pytest.approx((lr, 0.5 * lr, 2 * lr), rel=1e-5)
        p = min(t, 8) / 8
        assert wd_a == pytest.approx(0.4 + (0.04 - 0.4) * (1 + math.cos(math.pi * p)) / 2,
                                     rel=1e-5)
        assert wd_b == pytest.approx(0.0 if t < 3 else 0.1 if t < 6 else 0.2, abs=1e-7)
        wd = 0.3 * min(t, 4) / 4 if t < 4 else 0.3 * 0.5 ** ((t - 4) / 2)
        assert wd_c == pytest.approx(wd, rel=1e-5)
        momentum = (0.9 if t < 2 else 0.5 if t < 5 else 0.1) * (0.5 if 4 <= t < 6 else 1.0)
        assert m_a == m_b == m_c == pytest.approx(momentum, rel=1e-6)


def test_class_relations_model_zoo_relies_on():
    assert issubclass(lr_sched.LRScheduler, sched.Scheduler)
    assert issubclass(wd_sched.WeightDecayScheduler, sched.Scheduler)
    assert not issubclass(wd_sched.CosineDecayWD, lr_sched.LRScheduler)
    assert issubclass(lr_sched.SequentialLR, sched.SequentialScheduler)
    assert issubclass(lr_sched.PiecewiseConstantLR, sched.PiecewiseConstantScheduler)
    assert issubclass(sched.PiecewiseConstantScheduler, sched.SequentialScheduler)
    assert issubclass(lr_sched.ChainedScheduler, sched.ChainedScheduler)
    assert issubclass(wd_sched.SequentialWD, sched.SequentialScheduler)
    # A property, as in the real package (abstract in the generic base).
    assert lr_sched.LRScheduler.param_group_key.fget(None) == "lr"
    assert wd_sched.WeightDecayScheduler.param_group_key.fget(None) == "weight_decay"
    assert issubclass(lr_sched.LRScheduler, torch.optim.lr_scheduler.LRScheduler)
    from torch.optim.optimizer import ParamsT as torch_params_type

    from cerebras.pytorch.optim.optimizer import ParamsT
    assert ParamsT is torch_params_type
    # Model Zoo builds config classes from the constructors: the optimizer is annotated
    # so that it becomes an optional field filled in at construction.
    for base in (lr_sched.LRScheduler, wd_sched.WeightDecayScheduler):
        todo = [base]
        while todo:
            cls = todo.pop()
            todo.extend(cls.__subclasses__())
            params = inspect.signature(cls.__init__).parameters
            if "optimizer" in params:
                assert params["optimizer"].annotation is torch.optim.Optimizer, cls


def test_tags_are_a_set_and_checkpoints_resume():
    cstorch.backend("CPU")
    params = _params()
    opt = cstorch.optim.AdamW(_groups(params), lr=0.1, weight_decay=0.01)
    s = wd_sched.StepWD(opt, initial_val=0.1, step_size=2, gamma=0.5, param_group_tags="b")
    assert s.param_group_tags == {"b"} and s.param_group_key == "weight_decay"
    for _ in range(5):
        s.step()
    assert s.get_last_value() == pytest.approx([0.1 * 0.25])
    decays = [float(g["weight_decay"]) for g in opt.param_groups]
    assert decays == pytest.approx([0.01, 0.025, 0.01])
    saved = s.state_dict()
    assert int(saved["last_epoch"]) == 5 and saved["param_group_tags"] == {"b"}
    assert saved["initial_val"] == 0.1 and saved["step_size"] == 2 and saved["gamma"] == 0.5
    other = wd_sched.StepWD(opt, initial_val=0.1, step_size=2, gamma=0.5, param_group_tags="b")
    other.load_state_dict(saved)
    assert other.last_epoch == 5 and other.get_last_value() == pytest.approx([0.025])


def _opt():
    cstorch.backend("CPU")
    return cstorch.optim.SGD(_groups(_params()), lr=0.1, momentum=0.9, weight_decay=0.01)


@pytest.mark.parametrize("make, error, match", [
    (lambda opt: sched.PiecewiseConstantScheduler(opt, lr_sched.ConstantLR, [0.1, 0.2], [1]),
     TypeError, "abstract method param_group_key"),
    (lambda opt: lr_sched.PiecewiseConstantLR(opt, [0.1], [1]),
     ValueError, "one more value than milestones"),
    (lambda opt: lr_sched.PiecewiseConstantLR(opt, [1, 2, 3], [4, 2]),
     ValueError, "must not decrease"),
    (lambda opt: EpsConstant(opt, 1e-3), ValueError, "param group 0 has no such entry"),
    (lambda opt: wd_sched.ConstantWD(opt, val=0.1, param_group_tags="z"), ValueError,
     r"no param group of the optimizer has any of the tags \['z'\]"),
    (lambda opt: wd_sched.ConstantWD(torch.optim.SGD(_params(), lr=0.1), val=0.1), TypeError,
     "SGD is not a cstorch.optim.Optimizer"),
    (lambda opt: lr_sched.ChainedLR([]), ValueError, "at least one scheduler"),
    (lambda opt: lr_sched.ChainedLR([lr_sched.ConstantLR(opt, learning_rate=0.1),
                                     wd_sched.ConstantWD(opt, val=0.1)]),
     ValueError, "same param group key"),
    (lambda opt: lr_sched.ChainedLR([lr_sched.ConstantLR(opt, learning_rate=0.1),
                                     lr_sched.LinearLR(opt, 0.0, 1.0, 4)]),
     ValueError, "LinearLR starts at 0"),
    (lambda opt: lr_sched.SequentialLR(opt, [lr_sched.ConstantLR(opt, learning_rate=0.1),
                                             lr_sched.ConstantLR(opt, learning_rate=0.2)],
                                       None),
     TypeError, "Expected milestones to be a list of integers"),
    (lambda opt: lr_sched.SequentialLR(opt, [lr_sched.ConstantLR(opt, 0.1, param_group_tags="a"),
                                             lr_sched.ConstantLR(opt, 0.2)], [2],
                                       param_group_tags="b"),
     ValueError, r"drives param groups \[1\] that its ConstantLR does not"),
    (lambda opt: lr_sched.CosineAnnealingWarmRestarts(opt, 1.0, T_0=0), ValueError,
     "T_0, the period in steps, to be a positive integer"),
    (lambda opt: lr_sched.SequentialLR(opt, [lr_sched.ConstantLR(opt, learning_rate=0.1)], [3]),
     ValueError, "one milestone fewer than schedulers"),
    (lambda opt: lr_sched.ScalePerParamLR(opt, wd_sched.ConstantWD(opt, val=0.1)), TypeError,
     "wraps a scheduler of the param groups' 'lr', got ConstantWD"),
    (lambda opt: lr_sched.ChainedLR([object()]), TypeError, "takes cstorch.optim schedulers"),
    (lambda opt: lr_sched.ConstantLR(opt, learning_rate=0.1, param_group_tags=3), TypeError,
     "param group tags must be a string or a collection"),
])
def test_bad_arguments(make, error, match):
    opt = _opt()
    with pytest.raises(error, match=match):
        make(opt)


def test_sequential_runs_each_schedule_from_its_milestone():
    opt = _opt()
    s = lr_sched.SequentialLR(opt, [
        lr_sched.ConstantLR(opt, learning_rate=0.1, total_iters=3),
        lr_sched.LinearLR(opt, initial_learning_rate=0.2, end_learning_rate=0.0, total_iters=2),
        lr_sched.ConstantLR(opt, learning_rate=0.5)], [3, 5])
    assert s.milestones == [3, 5]
    rates = []
    for _ in range(7):
        rates.append(s.get_last_lr()[0])
        s.step()
    assert rates == pytest.approx([0.1, 0.1, 0.1, 0.2, 0.1, 0.5, 0.5])
