"""Building a recipe's value on the devices: one small jitted JAX program per recipe
shape, whose ops are the bridge's ATen lowerings."""
from collections import OrderedDict
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.utils._pytree as pytree

from bridge import LOWERINGS, jax_to_tensor, to_jax_dtype, to_torch_dtype
from bridge.convert import tensor_to_numpy
from cstorch.lazy_init.random_draws import draw
from cstorch.lazy_init.recipe import Ref, native

aten = torch.ops.aten


class _Slot(NamedTuple):
    """A recipe tensor in a program: output `index` of value `pos`, through `chain`."""
    pos: int
    index: object
    chain: tuple


def _linearize(root: Ref):
    """The nodes `root` depends on, in an order where each follows its inputs."""
    order, seen, stack = [], set(), [(root.node, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        stack.extend((d, False) for d in reversed(node.deps()) if id(d) not in seen)
    return order


def _freeze(x):
    """A hashable key for a program argument; equal keys mean the same program."""
    if isinstance(x, _Slot):
        return ("slot", x.pos, _freeze(x.index), _freeze(x.chain))
    if isinstance(x, list):
        return ("list",) + tuple(_freeze(v) for v in x)
    if isinstance(x, tuple):
        return ("tuple",) + tuple(_freeze(v) for v in x)
    if isinstance(x, dict):
        return ("dict",) + tuple(sorted((k, _freeze(v)) for k, v in x.items()))
    if isinstance(x, jax.ShapeDtypeStruct):
        return ("shape", tuple(x.shape), str(x.dtype))
    if isinstance(x, (bool, int, float, complex)):
        return (type(x).__name__, repr(x))
    return x


def _program(root: Ref):
    """(steps, key, consts, seeds): the recipe of `root` as a list of steps that refer to
    earlier steps by position; constants and seeds are the program's inputs."""
    order = _linearize(root)
    pos = {id(n): i for i, n in enumerate(order)}
    consts, seeds = [], []

    def slot(x):
        if isinstance(x, Ref):
            return _Slot(pos[id(x.node)], x.index, x.chain)
        return x

    steps = []
    for node in order:
        if node.kind == "const":
            steps.append(("const", len(consts), node.dtypes))
            consts.append(node.value)
        elif node.kind == "op":
            args, kwargs = pytree.tree_map(slot, (node.args, node.kwargs),
                                           is_leaf=lambda x: isinstance(x, Ref))
            seed = None
            if node.seed is not None:
                seed = len(seeds)
                seeds.append(node.seed)
            steps.append(("op", node.op, args, kwargs, seed, node.dtypes))
        else:
            base, chain, value = node.args
            steps.append(("write", slot(base), chain, slot(value), node.dtypes))
    const_key = tuple((tuple(c.shape), str(c.dtype)) for c in consts)
    key = (_freeze(steps), _freeze(slot(root)), root.dtype, const_key)
    return steps, key, consts, seeds


def _chain(value, chain):
    for op, args, kwargs, index in chain:
        value = LOWERINGS[op](value, *args, **kwargs)
        if index is not None:
            value = value[index]
    return value


def _cast(value, dtype):
    want = to_jax_dtype(dtype)
    return value if value.dtype == want else value.astype(want)


def _run(steps, root, consts, seeds):
    values = []

    def get(s):
        if isinstance(s, _Slot):
            v = values[s.pos]
            return _chain(v if s.index is None else v[s.index], s.chain)
        return s

    for step in steps:
        kind = step[0]
        if kind == "const":
            values.append(consts[step[1]])
        elif kind == "op":
            _, op, args, kwargs, seed, dtypes = step
            args, kwargs = pytree.tree_map(get, (args, kwargs), is_leaf=lambda x: isinstance(x, _Slot))
            if seed is None:
                out = LOWERINGS[op](*args, **kwargs)
            else:
                key = jax.random.fold_in(jax.random.key(seeds[seed, 0]), seeds[seed, 1])
                out = draw(op, args, kwargs, key, dtypes)
            if isinstance(dtypes, tuple):
                out = tuple(_cast(o, d) for o, d in zip(out, dtypes))
            else:
                out = _cast(out, dtypes)
            values.append(out)
        else:
            _, base, chain, value, dtype = step
            values.append(_write(get(base), chain, get(value)))
    return _cast(get(root[0]), root[1])


# Where a random op's arguments give its shape: the first argument's shape, or a size.

def _write(base, chain, value):
    """`base` with the elements the view `chain` selects set to `value`."""
    if base.ndim == 0:
        index = _chain(jnp.zeros((), jnp.int32), chain)
        flat = base.reshape(1).at[index].set(jnp.broadcast_to(value, index.shape).astype(base.dtype))
        return flat.reshape(())
    coords = tuple(_chain(jax.lax.broadcasted_iota(jnp.int32, base.shape, d), chain)
                   for d in range(base.ndim))
    return base.at[coords].set(jnp.broadcast_to(value, coords[0].shape).astype(base.dtype))


_programs: "OrderedDict[tuple, object]" = OrderedDict()
_MAX_PROGRAMS = 256


def _const_input(value, sharding):
    if isinstance(value, jax.Array):
        if value.sharding.device_set == sharding.device_set:
            return value
        value = jax_to_tensor(value)  # another backend's devices: through the host
    if not native(value.dtype):
        value = value.to(to_torch_dtype(to_jax_dtype(value.dtype)))
    return tensor_to_numpy(value)


def build(root: Ref, sharding):
    """The value of `root` computed on the devices of `sharding`, laid out by it."""
    steps, key, consts, seeds = _program(root)
    key = (key, sharding)
    fn = _programs.get(key)
    if fn is None:
        rootslot = (_Slot(len(steps) - 1, root.index, root.chain), root.dtype)
        fn = jax.jit(partial(_run, steps, rootslot), out_shardings=sharding)
        _programs[key] = fn
        if len(_programs) > _MAX_PROGRAMS:
            _programs.popitem(last=False)
    else:
        _programs.move_to_end(key)
    seed_words = np.array([[(s >> 32) & 0xFFFFFFFF, s & 0xFFFFFFFF] for s in seeds],
                          dtype=np.uint32).reshape(len(seeds), 2)
    return fn(tuple(_const_input(c, sharding) for c in consts), seed_words)
