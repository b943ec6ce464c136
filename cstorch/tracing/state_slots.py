"""The state list a program takes and returns: one array per state cell it uses, except
that a group of cells the program holds stacked (`bridge.stacked_state`: a loop's
per-layer parameters and their optimizer state) is one array, at its first cell's place.

Between steps such a group's cells hold `Row`s of the array the program returned, so the
next call passes that array on as it is; a cell read or written in between holds an
array of its own, and its group is stacked again for the next call.
"""
import jax
import jax.numpy as jnp
import numpy as np

from bridge.device_tensor import Row


def slots(taken, groups) -> tuple:
    """Per entry of the program's state list: a cell index, or a group's cell indices."""
    first = {g[0]: tuple(g) for g in groups}
    member = {i for g in groups for i in g}
    return tuple(first.get(i, i) for i in taken if i in first or i not in member)


def arguments(program_slots, arrays) -> list:
    """The program's state list from the run's arrays (`RunState.arrays_list`)."""
    out, unstacked = [], {}
    for at, s in enumerate(program_slots):
        if type(s) is int:
            value = arrays[s]
            if type(value) is Row:   # a row of another program's group, taken on its own
                value = arrays[s] = value.read()
            out.append(value)
            continue
        values = [arrays[i] for i in s]
        first = values[0]
        if all(type(v) is Row and v.stack is first.stack and v.k == k
               for k, v in enumerate(values)) and first.stack.shape[0] == len(s):
            out.append(first.stack)
        else:
            out.append(None)
            unstacked[at] = [v.read() if type(v) is Row else v for v in values]
    if unstacked:   # the first call, or cells read or written since the last one
        positions = list(unstacked)
        (device,) = unstacked[positions[0]][0].sharding.device_set
        # On the host, group by group, each group's cells given rows of its stacked array
        # at once: their own arrays are freed before the next group is stacked, instead of
        # living on beside the stacked copies until the step's new state comes back.
        batches = [[at] for at in positions] if device.platform == "cpu" else [positions]
        for batch in batches:
            for at, stacked in zip(batch, _stack_all([unstacked.pop(at) for at in batch])):
                out[at] = stacked
                for k, i in enumerate(program_slots[at]):
                    arrays[i] = Row(stacked, k)
    return out


def store(program_slots, arrays, new_state):
    """The run's arrays take the program's new state."""
    for s, value in zip(program_slots, new_state):
        if type(s) is int:
            arrays[s] = value
        else:
            for k, i in enumerate(s):
                arrays[i] = Row(value, k)


def read_rows(arrays):
    """Every `Row` among the run's arrays made an array of its own."""
    for i, a in enumerate(arrays):
        if type(a) is Row:
            arrays[i] = a.read()


def _stack_all(groups: list) -> list:
    """Each group of arrays stacked. On the host's CPU devices the values are stacked by
    numpy, which compiles nothing (a first call stacks dozens of shapes); elsewhere by one
    program for all groups."""
    (device,) = groups[0][0].sharding.device_set
    if device.platform == "cpu":
        return [jax.device_put(np.stack([np.asarray(v) for v in g]), device) for g in groups]
    return _stack_groups(groups)


@jax.jit
def _stack_groups(groups):
    return [jnp.stack(g) for g in groups]


def expand(program_slots, values, taken, groups) -> dict:
    """{cell index: value} for the lowered function, whose `groups` each take one stacked
    value at their first cell: from the program's state list `values`, stacking the
    groups the program takes cell by cell."""
    by_cell = {}
    for s, v in zip(program_slots, values):
        if type(s) is int:
            by_cell[s] = v
        else:
            by_cell[s[0]] = v
            by_cell.update((i, None) for i in s[1:])
    for g in groups:
        if by_cell.get(g[1]) is not None:   # taken cell by cell
            by_cell[g[0]] = jnp.stack([by_cell[i] for i in g])
            by_cell.update((i, None) for i in g[1:])
    return {i: by_cell[i] for i in taken}


def contract(program_slots, outs: list, groups) -> list:
    """The program's state list from the lowered function's state outputs (one per cell,
    each group's stacked value at its first cell)."""
    unstacked = {}
    taken_whole = {s[0] for s in program_slots if type(s) is not int}
    for g in groups:
        if g[0] not in taken_whole:
            unstacked.update((i, outs[g[0]][k]) for k, i in enumerate(g))
    return [outs[s[0]] if type(s) is not int else unstacked.get(s, outs[s])
            for s in program_slots]
