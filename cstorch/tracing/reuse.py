"""A capture that found an earlier program again takes that program's compiled step.

A program is set aside when a Python value it watches changes (`python_values`): the
step is captured again, since the new value may change what it computes. Most often it
does not (a trainer's global step, which only the step closures read after the step), and
the new capture computes just like the program set aside (`Program.computes_like`): the
same graph over the same state layout and key, hence the same lowered function and the
same executable. Compiling it again would cost seconds of XLA's time for nothing, so the
new program takes the compiled step of the one set aside, with what is its own: the
closures the step recorded this time, the Python values and hooks as they are now.

A program whose capture did not compute like any of them is compiled as always, so a
changed value that matters never runs an older program.
"""
import dataclasses

from bridge.device_tensor import GradSource


def compiled_like(traced, earlier):
    """The program `traced` (captured, not compiled) with the compiled step of the first
    of `earlier` that computes like it; None when none does."""
    for old in earlier:
        if old.compiled is not None and old.computes_like(traced):
            return dataclasses.replace(
                old, closures=traced.closures, held_results=traced.held_results,
                constants=traced.constants, python_values=traced.python_values,
                hooks=traced.hooks,
                # What a program keeps between its calls starts afresh, as for a program
                # just compiled.
                grad_source=GradSource(), grads_bound=-1, unread_grad_arrays={})
    return None
