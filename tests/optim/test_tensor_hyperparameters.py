"""Every cstorch optimizer steps the same whether its float hyperparameters are Python
floats or 0-d float32 tensors, as a traced step passes them: each nonzero float of a param
group (and each nonzero float of a tuple such as ``betas``) becomes a tensor, while zeros,
bools, ints, strings and None stay as they are.

The tensor runs step under a dispatch mode that refuses to read any tensor's value into
Python (``.item()``, ``bool()``, ``float()``, a tensor given as ``alpha=``/``value=`` or
to ``math``): eager torch would do that silently, but inside a traced step the value of a
hyperparameter is unknown, so such a read breaks the capture.
"""
import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import cerebras.pytorch as cstorch

RTOL, ATOL = 1e-6, 1e-7
STEPS = 3

# (case id, optimizer class name, kwargs, steps). Each optimizer has a variant with its
# weight decay and momentum-like options nonzero and one with them 0.
CASES = [
    ("SGD_momentum", "SGD", dict(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01), STEPS),
    ("SGD_nesterov", "SGD", dict(lr=0.1, momentum=0.9, weight_decay=0.01, nesterov=True,
                                 maximize=True), STEPS),
    ("SGD_zero", "SGD", dict(lr=0.1, momentum=0.0, dampening=0.0, weight_decay=0.0), STEPS),
    ("Adam_wd", "Adam", dict(lr=0.01, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.1), STEPS),
    ("Adam_wd_amsgrad", "Adam", dict(lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1,
                                     amsgrad=True), STEPS),
    ("Adam_zero", "Adam", dict(lr=0.01, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0), STEPS),
    ("AdamW_wd", "AdamW", dict(lr=0.01, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.1), STEPS),
    ("AdamW_nocorrect", "AdamW", dict(lr=0.01, weight_decay=0.1, correct_bias=False), STEPS),
    ("AdamW_zero", "AdamW", dict(lr=0.01, betas=(0.0, 0.999), weight_decay=0.0), STEPS),
    ("Adadelta_wd", "Adadelta", dict(lr=1.0, rho=0.9, eps=1e-6, weight_decay=0.01,
                                     maximize=True), STEPS),
    ("Adadelta_zero", "Adadelta", dict(lr=1.0, rho=0.9, eps=1e-6, weight_decay=0.0), STEPS),
    ("Adafactor_wd_beta1", "Adafactor", dict(lr=0.01, eps=(1e-30, 1e-3), clip_threshold=1.0,
                                             decay_rate=-0.8, beta1=0.9, weight_decay=0.01), STEPS),
    ("Adafactor_relative", "Adafactor", dict(lr=None, relative_step=True, warmup_init=True, beta1=0.5,
                                             weight_decay=0.1, clip_threshold=0.5), STEPS),
    ("Adafactor_zero", "Adafactor", dict(lr=0.01, weight_decay=0.0, scale_parameter=False), STEPS),
    ("Adagrad_decay", "Adagrad", dict(lr=0.05, lr_decay=0.01, weight_decay=0.01,
                                      initial_accumulator_value=0.1, eps=1e-10), STEPS),
    ("Adagrad_zero", "Adagrad", dict(lr=0.05, lr_decay=0.0, weight_decay=0.0,
                                     initial_accumulator_value=0.0), STEPS),
    ("Adamax_wd", "Adamax", dict(lr=0.01, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01,
                                 maximize=True), STEPS),
    ("Adamax_zero", "Adamax", dict(lr=0.01, weight_decay=0.0), STEPS),
    ("ASGD_averaging", "ASGD", dict(lr=0.01, lambd=1e-4, alpha=0.75, t0=1.0, weight_decay=0.01),
     STEPS),
    ("ASGD_zero", "ASGD", dict(lr=0.01, lambd=0.0, weight_decay=0.0), STEPS),
    ("Lamb_wd", "Lamb", dict(lr=0.01, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01), STEPS),
    ("Lamb_adam", "Lamb", dict(lr=0.01, weight_decay=0.01, adam=True), STEPS),
    ("Lamb_zero", "Lamb", dict(lr=0.01, weight_decay=0.0), STEPS),
    ("Lion_wd", "Lion", dict(lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1), STEPS),
    ("Lion_zero", "Lion", dict(lr=1e-3, betas=(0.9, 0.99), weight_decay=0.0), STEPS),
    ("NAdam_wd", "NAdam", dict(lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                               momentum_decay=4e-3), STEPS),
    ("NAdam_zero", "NAdam", dict(lr=0.01, weight_decay=0.0, momentum_decay=0.0), STEPS),
    ("Muon_wd", "Muon", dict(lr=0.02, weight_decay=0.01, momentum=0.95, nesterov=True,
                             ns_steps=5), STEPS),
    ("Muon_zero", "Muon", dict(lr=0.02, weight_decay=0.0, momentum=0.9, nesterov=False,
                               ns_steps=3), STEPS),
    ("RAdam_wd", "RAdam", dict(lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01), STEPS),
    ("RAdam_zero", "RAdam", dict(lr=0.01, weight_decay=0.0), STEPS),
    # Long enough for rho_t to pass 5, so the rectified branch takes part.
    ("RAdam_rectified", "RAdam", dict(lr=0.01, betas=(0.9, 0.99), weight_decay=0.01), 8),
    ("RMSprop_centered_momentum", "RMSprop", dict(lr=0.01, alpha=0.99, eps=1e-8,
                                                  weight_decay=0.01, momentum=0.5,
                                                  centered=True), STEPS),
    ("RMSprop_zero", "RMSprop", dict(lr=0.01, alpha=0.9, weight_decay=0.0, momentum=0.0),
     STEPS),
    ("Rprop", "Rprop", dict(lr=0.01, etas=(0.5, 1.2), step_sizes=(1e-6, 50)), STEPS),
    ("Rprop_bounded", "Rprop", dict(lr=0.01, etas=(0.5, 1.2), step_sizes=(0.006, 0.0125)), 5),
    ("Rprop_zero_low", "Rprop", dict(lr=0.01, etas=(0.25, 2.0), step_sizes=(0.0, 0.015)), 5),
]


class NoScalarReads(TorchDispatchMode):
    """Refuse any read of a tensor's value into Python."""

    REFUSED = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.is_nonzero.default,
               torch.ops.aten.item.default}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in self.REFUSED:
            raise AssertionError(f"a step read a tensor's value into Python ({func}); inside a "
                                 f"traced step a tensor hyperparameter has no value")
        return func(*args, **(kwargs or {}))


def _is_float(value):
    return isinstance(value, float)


def _as_tensor(value):
    """What a traced step receives for a hyperparameter."""
    if _is_float(value) and value != 0:
        return torch.tensor(value, dtype=torch.float32)
    if isinstance(value, tuple):
        return tuple(_as_tensor(v) for v in value)
    return value


def _as_float32(value):
    """A float rounded to the nearest float32 (so float and tensor runs use one value)."""
    if _is_float(value):
        return float(np.float32(value))
    if isinstance(value, tuple):
        return tuple(_as_float32(v) for v in value)
    return value


def _run(cls_name, kwargs, steps, tensors, round_floats=False):
    """`steps` steps on two parameters of different shapes with seeded gradients; returns
    the optimizer (after the steps) and its parameters."""
    cstorch.backend("CPU")
    torch.manual_seed(0)
    # Muon updates matrices only: a tall and a wide one
    shapes = [(4, 3), (3, 5)] if cls_name == "Muon" else [(4, 3), (5,)]
    params = [torch.nn.Parameter(torch.randn(*shape)) for shape in shapes]
    grads = [[torch.randn_like(p) for p in params] for _ in range(steps)]
    opt = getattr(cstorch.optim, cls_name)(params, **kwargs)
    for group in opt.param_groups:
        for key in list(group):
            if key != "params":
                if round_floats:
                    group[key] = _as_float32(group[key])
                if tensors:
                    group[key] = _as_tensor(group[key])
    if tensors:
        # What was replaced is what a traced step would pass as tensors.
        group = opt.param_groups[0]
        assert any(isinstance(v, torch.Tensor) for v in group.values())
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = g.clone()
        if tensors:
            with NoScalarReads():
                opt.step()
        else:
            opt.step()
    return opt, [p.detach().clone() for p in params]


def _assert_close(actual, expected, what):
    torch.testing.assert_close(actual, expected, rtol=RTOL, atol=ATOL, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_tensor_hyperparameters_step_like_floats(case):
    """Float hyperparameters that are float32 values already (0.999 is used as the float32
    nearest it, on both sides), so a tensor hyperparameter is the very same number and
    only the code paths differ: parameters and state must agree to float32 rounding."""
    _, cls_name, kwargs, steps = case
    opt_f, expected = _run(cls_name, kwargs, steps, tensors=False, round_floats=True)
    opt_t, actual = _run(cls_name, kwargs, steps, tensors=True, round_floats=True)
    _, initial = _run(cls_name, kwargs, 0, tensors=False)
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert not torch.equal(e, initial[i])  # the steps moved it
        _assert_close(a, e, f"parameter {i}")
    state_f, state_t = opt_f.state_dict()["state"], opt_t.state_dict()["state"]
    assert state_f.keys() == state_t.keys()
    for i in state_f:
        assert state_f[i].keys() == state_t[i].keys()
        for key, value in state_f[i].items():
            # State entries can cancel to near zero (a momentum of gradients of both
            # signs), so their tolerance is relative to the entry's scale.
            scale = value.abs().max().clamp_min(1e-30).item()
            torch.testing.assert_close(state_t[i][key], value, rtol=RTOL, atol=10 * ATOL * scale,
                                       msg=lambda m: f"state {i}.{key}: {m}")  # noqa: B023 (used within this iteration)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_decimal_float_hyperparameters_step_like_their_float32_tensors(case):
    """The same with decimal floats as written (0.999), against float32 tensors of them.

    Here the hyperparameters themselves differ: float32(0.999) - 0.999 is 1.3e-8, but
    ``1 - beta2`` (the weight of the new squared gradient) differs by 1.3e-5 relative. With
    bias correction that cancels; where nothing normalises it (AdamW without bias
    correction, Lamb with ``adam=True``) three steps move parameters of size ~0.3 by
    ~2e-6 relative, so this comparison uses the fixture tolerance of the real package's
    trajectories (1e-5) rather than 1e-6.
    """
    _, cls_name, kwargs, steps = case
    _, expected = _run(cls_name, kwargs, steps, tensors=False)
    _, actual = _run(cls_name, kwargs, steps, tensors=True)
    for i, (a, e) in enumerate(zip(actual, expected)):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=ATOL, msg=lambda m: f"parameter {i}: {m}")  # noqa: B023 (used within this iteration)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_init_state_takes_tensor_hyperparameters(case):
    """The state each parameter gets is decided by zeros, which stay numbers, so a group
    of tensor hyperparameters gives the same state entries, and the same values."""
    _, cls_name, kwargs, _ = case
    opt, _ = _run(cls_name, kwargs, 0, tensors=False, round_floats=True)
    for group in opt.param_groups:
        tensor_group = {k: v if k == "params" else _as_tensor(v) for k, v in group.items()}
        for p in group["params"]:
            expected = opt.init_state(p, group)
            with NoScalarReads():
                actual = opt.init_state(p, tensor_group)
            assert actual.keys() == expected.keys()
            for key in expected:
                torch.testing.assert_close(actual[key], expected[key], rtol=0, atol=0)


def test_every_optimizer_has_a_case():
    covered = {c[1] for c in CASES}
    classes = {name for name in cstorch.optim.__all__
               if isinstance(getattr(cstorch.optim, name), type)
               and issubclass(getattr(cstorch.optim, name), cstorch.optim.Optimizer)
               and getattr(cstorch.optim, name) is not cstorch.optim.Optimizer}
    assert classes <= covered, sorted(classes - covered)


def test_is_set():
    from cstorch.optim._update import is_set
    assert is_set(torch.tensor(0.0)) is True  # a tensor's value is not known when traced
    assert is_set(torch.tensor(0.5)) is True
    assert is_set(0.0) is False and is_set(0) is False
    assert is_set(1e-4) is True and is_set(-0.8) is True


def test_a_scheduler_drives_a_group_of_tensor_hyperparameters():
    cstorch.backend("CPU")
    sched = cstorch.optim.lr_scheduler

    class InverseTimeLR(sched.LambdaLR):
        """A LambdaLR with its own function of the step, as the real package has it."""

        def set_value_lambda(self):
            return lambda step: 1 / (1 + step)

    def run(tensors):
        torch.manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(5))]
        opt = cstorch.optim.AdamW(params, lr=0.01, weight_decay=0.1)
        if tensors:
            for group in opt.param_groups:
                for key in list(group):
                    if key != "params":
                        group[key] = _as_tensor(group[key])
        lr_sched = InverseTimeLR(opt, initial_learning_rate=0.01)
        for _ in range(STEPS):
            for p in params:
                p.grad = torch.randn_like(p)
            opt.step()
            lr_sched.step()
        return params, lr_sched.get_last_lr()

    (expected, lr_f), (actual, lr_t) = run(False), run(True)
    assert lr_t == pytest.approx(lr_f, rel=1e-6)
    for a, e in zip(actual, expected):
        _assert_close(a.detach(), e.detach(), "parameter")
