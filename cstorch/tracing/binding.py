"""Binding the run to a capture's traced values: every state entry, the optimizers'
per-parameter state and their float hyperparameters point at traced stand-ins while the
step runs, and back at the run's values after."""
import contextlib

from cstorch.errors import StepRefusedError
from cstorch.optim import _update


@contextlib.contextmanager
def bind_state(backend, traced):
    """Point every state entry, and the optimizers' per-parameter state, at traced values."""
    state = backend.state
    saved = [(e, e.get()) for e in state.entries]
    for e in state.entries:
        e.set(traced[e.cell])
    keyed = [opt.keyed_by({id(e.tensor): traced[e.cell] for e in state.entries})
             for opt in backend.optimizers]
    with contextlib.ExitStack() as stack:
        for k in keyed:
            stack.enter_context(k)
        try:
            yield
        finally:
            for e, value in saved:
                e.set(value)


@contextlib.contextmanager
def bind_hyperparameters(items, traced):
    """Point the param groups' float hyperparameters at traced scalars. `traced` holds the
    values, then their complements (`cstorch.optim._update.one_minus`)."""
    values, comps = traced[:len(items)], traced[len(items):]
    token = _update.complements.set({id(v): c for v, c in zip(values, comps)})
    saved = []
    for (group, key, index, _), t in zip(items, values):
        saved.append((group, key, group[key]))
        if index is None:
            group[key] = t
        else:
            value = list(group[key])
            value[index] = t
            group[key] = tuple(value)
    try:
        yield
        for (group, key, index, _), t in zip(items, values):
            now = group[key] if index is None else group[key][index]
            if now is not t:
                # The program could not carry a value set here; restoring it would drop it.
                raise StepRefusedError(
                    f"the param group's {key!r} was assigned inside the traced step, where a "
                    "float hyperparameter is an input of the compiled program and the new "
                    "value would be lost; assign it between steps (that reuses the program), "
                    "or drive it with a cstorch.optim.lr_scheduler, which steps on the device")
    finally:
        _update.complements.reset(token)
        for group, key, value in reversed(saved):
            group[key] = value
