"""State held stacked: the parameters of a loop's layers (`bridge.scan_blocks`), and the
optimizer state updated alongside them, taken and returned by the program as one array
per kind instead of one per layer.

Looped layers read their parameters stacked; kept one array per layer, the program
stacks them on the way in, and the optimizer's update runs once per layer's parameter
(one set of XLA kernels and buffers each, which is what made a deep model's compile grow
with its depth). With a run of layers' parameters held as one array, the loop takes it as
it is, and an elementwise `torch._foreach_*` op whose lists hold every row of such arrays
(the update of the layers' query weights, their moments, their gradients, which the
gradient loop leaves stacked) runs once on the stacked arrays.

`plan` chooses, before the program is lowered, the state inputs that go in stacked: each
loop's per-layer parameters, and every state tensor that an elementwise foreach op
updates in the same lane (the same list position) as one of them, grouped by where it is
first used. Lowered, a stacked input's rows are read at offsets XLA cannot see
(`opaque_range`), so a row read outside the stacked ops is one kernel for all rows.
"""
import operator
from collections import Counter

import jax
import jax.numpy as jnp
import torch
import torch.fx as fx

_aten = torch.ops.aten
# Ops lowered to their argument itself: a value read through them is still the row.
_SAME_VALUE = {_aten.alias.default, _aten.detach.default, _aten.clone.default,
               _aten.alias_copy.default, _aten.detach_copy.default}
# Foreach ops that are elementwise per list position, so that a stacked list computes
# what its rows do one by one (not norm, max, mm: those reduce or multiply per tensor).
_NOT_ELEMENTWISE = ("_foreach_norm", "_foreach_max", "_foreach_mm")


def is_elementwise_foreach(target) -> bool:
    name = getattr(target, "__name__", "")
    return name.startswith("_foreach_") and not name.startswith(_NOT_ELEMENTWISE)


def _source(node):
    while isinstance(node, fx.Node) and node.op == "call_function" \
            and node.target in _SAME_VALUE and len(node.args) >= 1:
        node = node.args[0]
    return node


def _node_lists(node):
    return [a for a in node.args if isinstance(a, (list, tuple)) and a
            and all(isinstance(x, fx.Node) for x in a)]


def _alike(nodes) -> bool:
    vals = [n.meta.get("val") for n in nodes]
    return all(isinstance(v, torch.Tensor) for v in vals) and \
        len({(tuple(v.shape), v.dtype) for v in vals}) == 1


def plan(gm: fx.GraphModule, loops, n_state: int) -> list:
    """Groups of state input positions (among the first `n_state` placeholders), each in
    row order, that the lowered program takes stacked."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"][:n_state]
    position = {node: i for i, node in enumerate(placeholders)}
    groups, row = [], {}

    def add(nodes):
        row.update({n: (len(groups), k) for k, n in enumerate(nodes)})
        groups.append(nodes)

    for loop in loops:
        for s, kind in enumerate(loop.kinds):
            if kind != "xs":
                continue
            nodes = [_source(v) for v in loop.slots[s]]
            if all(n in position and n not in row for n in nodes) \
                    and len(set(nodes)) == len(nodes) and _alike(nodes):
                add(nodes)
    if not groups:
        return []
    parent = {}

    def find(x):
        parent.setdefault(x, x)
        while parent[x] is not x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def lane_member(x):
        # State, op results and the gradient loop's rows carry one lane's values; other
        # inputs (hyperparameters) and constants may be shared by lanes.
        return x in position or x.op == "call_function"

    first_use = {}
    foreach = [n for n in gm.graph.nodes
               if n.op == "call_function" and is_elementwise_foreach(n.target)]
    for node in foreach:
        lists = [[_source(x) for x in items] for items in _node_lists(node)]
        outputs = {u.args[1]: u for u in node.users if u.target is operator.getitem}
        lanes = {}
        for j, items in enumerate(lists):
            counts = Counter(items)
            once = {x for x in items if counts[x] == 1 and lane_member(x)}
            for p, x in enumerate(items):
                if x in once:
                    first_use.setdefault(x, (node, j))
                    lanes.setdefault(p, []).append(x)
        for p, members in lanes.items():
            if p in outputs:
                members.append(outputs[p])
            for other in members[1:]:
                parent[find(other)] = find(members[0])
    seed = {}
    for n, gk in row.items():
        root = find(n)
        seed[root] = gk if seed.get(root, gk) == gk else None
    found = {}
    for n in placeholders:
        if n in row or n not in first_use:
            continue
        gk = seed.get(find(n))
        if gk is not None:
            found.setdefault((gk[0], first_use[n]), {}).setdefault(gk[1], []).append(n)
    for (g, _), members in found.items():
        n = len(groups[g])
        if sorted(members) == list(range(n)) and all(len(v) == 1 for v in members.values()):
            nodes = [members[k][0] for k in range(n)]
            if _alike(nodes):
                add(nodes)
    return [tuple(position[n] for n in nodes) for nodes in groups]


def output_groups(gm: fx.GraphModule, loops, first: int, count: int) -> list:
    """Groups of output positions among `first` .. `first + count - 1` (the gradients a
    step leaves), in row order, whose values are the rows of one of `loops`' stacked
    outputs in the layers' order: the program returns each group as that array."""
    (output,) = [n for n in gm.graph.nodes if n.op == "output"]
    where = {}
    for p in range(first, first + count):
        node = output.args[0][p]
        while isinstance(node, fx.Node):   # the output, and what it is an alias of
            where.setdefault(node, []).append(p)
            if node.op != "call_function" or node.target not in _SAME_VALUE:
                break
            node = node.args[0]
    groups = []
    for loop in loops:
        for q in loop.ys:
            nodes = [layer[q] for layer in loop.layers]
            places = [where.get(n, ()) for n in nodes]
            if all(len(x) == 1 for x in places) and len({x[0] for x in places}) == len(nodes):
                groups.append(tuple(x[0] for x in places))
    return groups


def opaque_range(n):
    """0 .. n-1 as values XLA cannot see: a row of a stacked array is then read and written
    at an offset the kernel takes as an argument, so the kernels of all rows (the
    optimizer's update of each layer's parameter, say) are one kernel, which XLA's CPU
    backend compiles once; at constant offsets each row had kernels of its own, and
    compiling them cost more than the loop saved."""
    return jax.lax.optimization_barrier(jnp.arange(n, dtype=jnp.int32))


class LazyRow:
    """Row `k` of `stack`, not yet read: most rows of a stacked value are only ever passed
    on stacked, and reading each would cost a JAX op per row to trace."""
    __slots__ = ("stack", "k")

    def __init__(self, stack, k: int):
        self.stack, self.k = stack, k


class Rows:
    """The values of one lowering that are a row of a stacked array: `LazyRow`s, and the
    arrays read from them (id(row) -> (stack, k, row)), with the opaque offsets their
    reads use, one range per length."""

    def __init__(self):
        self.of = {}
        self._read = {}
        self._ranges = {}

    def index(self, n):
        if n not in self._ranges:
            self._ranges[n] = opaque_range(n)
        return self._ranges[n]

    def source(self, value):
        """(stack, k) when `value` is row k of a stacked array, else None."""
        if type(value) is LazyRow:
            return value.stack, value.k
        found = self.of.get(id(value))
        return found[:2] if found is not None and found[2] is value else None

    def read(self, value):
        """`value` as an array: a `LazyRow` read (once per row) at its opaque offset."""
        if type(value) is not LazyRow:
            return value
        key = (id(value.stack), value.k)
        if key not in self._read:
            part = jax.lax.dynamic_index_in_dim(value.stack, self.index(value.stack.shape[0])[value.k],
                                                keepdims=False)
            self.of[id(part)] = (value.stack, value.k, part)
            self._read[key] = (value.stack, part)
        return self._read[key][1]

    @staticmethod
    def split(stack) -> list:
        return [LazyRow(stack, k) for k in range(stack.shape[0])]

    def stack(self, values, index=None):
        """The `values` as one array: the stacked array itself when they are its rows in
        order; joined from slices when runs of them are consecutive rows of one (a
        gradient loop's inputs: the first layer's input, then every layer's output but
        the last); else written row by row into a new one."""
        sources = [self.source(v) for v in values]
        first = sources[0]
        if first is not None and first[0].shape[0] == len(values) and all(
                s is not None and s[0] is first[0] and s[1] == k for k, s in enumerate(sources)):
            return first[0]
        runs = []   # [stack, start, stop] for consecutive rows of one stack, else the value
        for v, s in zip(values, sources):
            last = runs[-1] if runs else None
            if s is not None and type(last) is list and last[0] is s[0] and last[2] == s[1]:
                last[2] += 1
            else:
                runs.append([s[0], s[1], s[1] + 1] if s is not None else v)
        if any(type(r) is list and r[2] - r[1] > 1 for r in runs):
            return jnp.concatenate([r[0][r[1]:r[2]] if type(r) is list else self.read(r)[None]
                                    for r in runs])
        values = [self.read(v) for v in values]
        index = self.index(len(values)) if index is None else index
        out = jnp.zeros((len(values), *jnp.shape(values[0])), jnp.result_type(values[0]))
        for k, v in enumerate(values):
            out = jax.lax.dynamic_update_index_in_dim(out, v, index[k], 0)
        return out


class Env(dict):
    """A lowering's values by node: a `LazyRow` is read when a node's value is looked up,
    and `raw` gives it unread (to ops that take it stacked)."""

    def __init__(self, rows: Rows):
        super().__init__()
        self.rows = rows

    def __getitem__(self, node):
        value = dict.__getitem__(self, node)
        if type(value) is LazyRow:
            value = self.rows.read(value)
            dict.__setitem__(self, node, value)
        return value

    def raw(self, node):
        return dict.__getitem__(self, node)


def foreach(lower_one, args, kwargs, rows: Rows, dtypes) -> list:
    """An elementwise foreach op: lowered once on the stacked arrays for the lanes whose
    list elements are every row of stacked arrays, and per element for the others.
    `lower_one` is the op's per-element lowering, `dtypes` the result dtype per lane."""
    listed = [j for j, a in enumerate(args) if isinstance(a, (list, tuple))]
    args = [a if j in listed else rows.read(a) for j, a in enumerate(args)]
    count = len(args[listed[0]])
    lanes = {}   # key -> {k: position}
    for p in range(count):
        key, k = [], None
        for j in listed:
            v = args[j][p]
            src = rows.source(v)
            if src is None:
                if isinstance(v, (int, float, bool)) or (hasattr(v, "shape") and v.shape == ()):
                    key.append(("shared", j, id(v) if hasattr(v, "shape") else v))
                    continue
                key = None
                break
            if k is not None and src[1] != k:
                key = None
                break
            k = src[1]
            key.append((id(src[0]), j))
        if key is None or k is None:
            continue
        lanes.setdefault(tuple(key), {})[k] = p
    out = [None] * count
    for by_row in lanes.values():
        p0 = by_row.get(0)
        stacks = [rows.source(args[j][p0])[0] for j in listed
                  if p0 is not None and rows.source(args[j][p0]) is not None]
        n = stacks[0].shape[0] if stacks else 0
        if sorted(by_row) != list(range(n)) or any(s.shape[0] != n for s in stacks):
            continue
        rank = max(s.ndim - 1 for s in stacks)
        stacked_args = list(args)
        for j in listed:
            v = args[j][p0]
            src = rows.source(v)
            if src is None:
                stacked_args[j] = [v]
                continue
            s = src[0]
            shape = (n,) + (1,) * (rank - (s.ndim - 1)) + s.shape[1:]
            stacked_args[j] = [s.reshape(shape)]
        result = lower_one(*stacked_args, **kwargs)[0]
        result = result.astype(dtypes[p0]) if result.dtype != dtypes[p0] else result
        for k, part in enumerate(rows.split(result)):
            out[by_row[k]] = part
    rest = [p for p in range(count) if out[p] is None]
    if rest:
        narrowed = [[rows.read(a[p]) for p in rest] if j in listed else a
                    for j, a in enumerate(args)]
        for p, value in zip(rest, lower_one(*narrowed, **kwargs)):
            out[p] = value if value.dtype == dtypes[p] else value.astype(dtypes[p])
    return out
