"""A program captured while gradients are pending takes them as inputs; when the step
clears them before its backward pass they are unread, and each call must not slice them
out of the last step's packed gradients again."""
import copy
import gc
import weakref

import numpy as np
import torch

import cerebras.pytorch as cstorch


def _setup(clear_first: bool):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16),
                                torch.nn.ReLU(), torch.nn.Linear(16, 3))
    reference = copy.deepcopy(model)
    compiled = cstorch.compile(model, cstorch.backend("CPU"))
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    @cstorch.trace
    def step(x, y):
        if clear_first:
            optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(compiled(x), y)
        loss.backward()
        optimizer.step()
        return loss

    return model, reference, step


def _batches():
    g = torch.Generator().manual_seed(1)
    for n in (32, 32, 16, 16, 16):   # the batch size changes: a second capture
        yield torch.randn(n, 8, generator=g), torch.randint(0, 3, (n,), generator=g)


def _eager(reference, clear_first):
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for x, y in _batches():
        if clear_first:
            optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(reference(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def test_cleared_pending_gradients_are_not_read_and_values_still_match():
    model, reference, step = _setup(clear_first=True)
    losses = [float(step(x, y)) for x, y in _batches()]
    np.testing.assert_allclose(losses, _eager(reference, True), rtol=1e-5)
    second = [p for programs in step.programs.values() for p in programs][-1]
    assert len(second.grad_inputs) == 6 and second.unread_grads == frozenset(range(6))
    # Passed zeros, one array per shape (the two biases of 16 share one), made once and
    # passed again on later calls; not the gradients of a step, which the program would
    # then hold for its life.
    kept = second.unread_grad_arrays
    assert sorted(kept) == list(range(6)) and len({id(a) for a in kept.values()}) == 5
    assert all(not np.asarray(a).any() for a in kept.values())
    for a, b in zip(model.parameters(), reference.parameters()):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-5, atol=1e-7)


def test_accumulated_gradients_stay_inputs():
    model, reference, step = _setup(clear_first=False)   # gradients add up across steps
    losses = [float(step(x, y)) for x, y in _batches()]
    np.testing.assert_allclose(losses, _eager(reference, False), rtol=1e-5)
    second = [p for programs in step.programs.values() for p in programs][-1]
    assert second.grad_inputs and not second.unread_grads


def test_gradients_a_step_clears_are_freed_before_it_runs():
    """As eager's `zero_grad` frees the gradients before the backward pass: the last step's
    gradients are gone when the next step (which clears them) starts, so that the two sets
    are not held at once; a gradient the user took stays theirs, and values match eager."""
    model, reference, step = _setup(clear_first=True)
    batches = list(_batches())[:3]
    float(step(*batches[0]))
    program = [p for programs in step.programs.values() for p in programs][-1]
    previous = [weakref.ref(a) for a in program.grad_source.outputs]
    taken = model[0].weight.grad            # the user's own reference to one gradient
    taken_value = taken.detach().numpy().copy()
    alive_at_dispatch = []
    compiled = program.compiled

    def dispatch(*args):
        gc.collect()
        alive_at_dispatch.append(sum(r() is not None for r in previous))
        return compiled(*args)

    program.compiled = dispatch
    for x, y in batches[1:]:
        float(step(x, y))
    # One device: the step returns its gradients packed in one array, and the user's
    # gradient is a slice of its own. (The third batch is smaller: another program.)
    assert len(previous) == 1 and alive_at_dispatch == [0]
    np.testing.assert_array_equal(taken.detach().numpy(), taken_value)

    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    for x, y in batches:
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(reference(x), y).backward()
        optimizer.step()
    for a, b in zip(model.parameters(), reference.parameters()):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(a.grad.detach().numpy(), b.grad.numpy(), rtol=1e-5,
                                   atol=1e-7)
