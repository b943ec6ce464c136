"""A Python value the step can reach changes at every step, as Model Zoo's trainer's global
step does: it lives in the trainer, which a global the step names (`_GLOBAL_SUMMARIES`)
holds, so it is watched (`python_values`); only the step closures read it, after the step.

Seen before the fix: the step was captured and compiled again at every step, since each
capture's step closures (a decorated method wrapped again, a function defined in a
callback) were new function objects, so no capture ever looked like the last one. Now the
first change costs one capture, which finds the program unchanged, takes its compiled
step (no compile) and stops watching the value; a value that does change what the step
computes is still captured and compiled again, and the results equal eager PyTorch.
"""
import copy
import functools

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import cerebras.pytorch as cstorch
from cstorch.tracing.same_function import same_callable

STEPS = 6
RTOL = 1e-5


class Trainer:
    """What Model Zoo's `Trainer` is to its step: a global step advanced after each batch,
    metrics logged through a step closure, settings read by the step."""

    def __init__(self):
        self.global_step = 0
        self.scale = 1.0          # read by the step: changes the loss
        self.should_step = True   # read by the step: whether the optimizer steps
        self.logged = []
        self.captures_after = []   # the step's captures after each step

    @cstorch.step_closure
    def log_in_step_closure(self, **metrics):
        self.logged.append((self.global_step, {k: float(v) for k, v in metrics.items()}))

    def log(self, **metrics):
        self.log_in_step_closure(**metrics)


class _Summaries:
    def __init__(self):
        self.stack = []


_SUMMARIES = _Summaries()


def summarize(name, value):
    """Model Zoo's `summarize_scalar`: the trainer reached through a global."""
    _SUMMARIES.stack[-1].log(**{name: value})


def on_after_forward(trainer, loss):
    """A callback that defines its step closure anew at every call (Model Zoo's profilers)."""
    def after_forward(loss):
        trainer.logged.append(("callback", float(loss)))
    cstorch.step_closure(after_forward)(loss)


def _models(seed=0):
    torch.manual_seed(seed)
    eager = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))
    return eager, copy.deepcopy(eager)


def _batches(n=STEPS):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(4, 5, generator=g), torch.randn(4, 3, generator=g)) for _ in range(n)]


def _run(trainer, change=lambda trainer, step: None, n=STEPS):
    """The traced loop and the same loop in eager PyTorch over the same batches: (traced
    step, traced losses, eager losses). `change(trainer, step)` runs before each step."""
    eager, ours = _models()
    cstorch.backend("CPU")
    compiled = cstorch.compile(ours)
    optimizer = cstorch.optim.SGD(ours.parameters(), lr=0.1)
    reference = torch.optim.SGD(eager.parameters(), lr=0.1)

    @cstorch.trace
    def step(x, y):
        loss = F.mse_loss(compiled(x), y) * trainer.scale
        on_after_forward(trainer, loss)
        loss.backward()
        if trainer.should_step:
            optimizer.step()
            optimizer.zero_grad()
        summarize("loss", loss)
        return loss

    batches = _batches(n)
    loader = cstorch.utils.data.DataLoader(lambda: batches)
    losses = []
    _SUMMARIES.stack.append(trainer)
    try:
        for i, (x, y) in enumerate(cstorch.utils.data.DataExecutor(loader, num_steps=n)):
            change(trainer, i)
            losses.append(float(step(x, y)))
            trainer.captures_after.append(step.captures)
            trainer.global_step += 1   # after the step, as Model Zoo's loop callback
    finally:
        _SUMMARIES.stack.pop()

    expected = []
    for i, (x, y) in enumerate(batches):
        change(trainer, i)
        loss = F.mse_loss(eager(x), y) * trainer.scale
        loss.backward()
        if trainer.should_step:
            reference.step()
            reference.zero_grad()
        expected.append(float(loss.detach()))
    return step, losses, expected


def test_a_changing_value_only_step_closures_read_compiles_the_step_once():
    trainer = Trainer()
    step, losses, expected = _run(trainer)
    assert losses == pytest.approx(expected, rel=RTOL)
    # One capture found that the global step changes nothing and took the compiled step.
    assert step.captures == 2   # before: one per step
    assert step.compiles == 1
    assert step.recaptures == []
    # The closures ran at every step with that step's values, the method's and the
    # callback's alike.
    assert [v for k, v in trainer.logged if k == "callback"] == pytest.approx(expected, rel=RTOL)
    logged = [(k, v["loss"]) for k, v in trainer.logged if k != "callback"]
    assert [k for k, _ in logged] == list(range(1, STEPS + 1))   # after the step advanced
    assert [v for _, v in logged] == pytest.approx(expected, rel=RTOL)


def test_a_changing_value_that_changes_the_loss_is_compiled_again():
    def change(trainer, i):
        trainer.scale = {0: 1.0, 2: 3.0, 4: 0.5}.get(i, trainer.scale)
    trainer = Trainer()
    step, losses, expected = _run(trainer, change)
    assert losses == pytest.approx(expected, rel=RTOL)
    assert step.compiles == 3   # one program per scale; the global step costs no compile
    assert [r[0].split(" changed")[0] for r in step.recaptures] == [
        "closure variable trainer of _run.<locals>.step.scale"] * 2


def test_a_value_that_switches_the_optimizer_step_on_and_off_stays_correct():
    """Gradient accumulation as Model Zoo's trainer does it on CPU: the optimizer steps
    every other batch. Two programs (with and without the step), each taken again once the
    global step stops being watched; the losses equal eager PyTorch's."""
    def change(trainer, i):
        trainer.should_step = i % 2 == 1
    trainer = Trainer()
    step, losses, expected = _run(trainer, change, n=10)
    assert losses == pytest.approx(expected, rel=RTOL)
    # Two programs: without the optimizer step (no gradients held), and with it
    # (gradients held from the batch before). Each is captured once more when the global
    # step first changes under it, and taken from then on.
    assert step.compiles == 2
    assert trainer.captures_after == [1, 2, 3, 4] + [4] * 6


def test_a_changing_value_passed_to_a_step_closure_is_captured_again():
    """A Python value handed to a step closure is part of what the program does: a new
    value is a new capture, so that the closure gets the value of its step."""
    eager, ours = _models()
    cstorch.backend("CPU")
    compiled = cstorch.compile(ours)
    seen = []

    @cstorch.step_closure
    def record(loss, step_number):
        seen.append((step_number, float(loss)))

    counter = {"step": 0}

    @cstorch.trace
    def step(x):
        loss = compiled(x).sum()
        record(loss, counter["step"])
        return loss

    batches = _batches(3)
    loader = cstorch.utils.data.DataLoader(lambda: [x for x, _ in batches])
    for i, x in enumerate(cstorch.utils.data.DataExecutor(loader, num_steps=3)):
        counter["step"] = i
        step(x)
    with torch.no_grad():
        expected = [float(eager(x).sum()) for x, _ in batches]
    assert [s for s, _ in seen] == [0, 1, 2]
    assert [v for _, v in seen] == pytest.approx(expected, rel=RTOL)
    assert step.compiles == 3


def _local(value):
    def inner():
        return value
    return inner


class _Holder:
    def method(self):
        return self


def test_same_callable_compares_what_the_callables_run():
    # A function made again from the same code over the same values is the same.
    assert same_callable(_local(1), _local(1))
    assert same_callable(_local((1, "a")), _local((1, "a")))
    # Other values in its closure, of another type, or other objects: not the same.
    assert not same_callable(_local(1), _local(2))
    assert not same_callable(_local(1), _local(1.0))
    assert not same_callable(_local([1]), _local([1]))   # two lists: by identity
    shared = [1]
    assert same_callable(_local(shared), _local(shared))
    # Wrappers compare what they wrap.
    assert same_callable(cstorch.step_closure(_local(1)), cstorch.step_closure(_local(1)))
    assert not same_callable(cstorch.step_closure(_local(1)), cstorch.step_closure(_local(2)))
    # Bound methods: the same function on the same object.
    a, b = _Holder(), _Holder()
    assert same_callable(a.method, a.method)
    assert not same_callable(a.method, b.method)
    # Partials: the same function and arguments.
    assert same_callable(functools.partial(max, 1, key=abs), functools.partial(max, 1, key=abs))
    assert not same_callable(functools.partial(max, 1), functools.partial(max, 2))
    assert not same_callable(functools.partial(max, 1, key=abs), functools.partial(max, 1))
    # Defaults are part of what a function runs.
    def f(x=1):
        return x
    g = type(f)(f.__code__, f.__globals__, f.__name__, (2,), f.__closure__)
    assert not same_callable(f, g)
    assert same_callable(f, type(f)(f.__code__, f.__globals__, f.__name__, (1,), f.__closure__))
    # Different code: not the same.
    assert not same_callable(lambda: 1, lambda: 1)
