"""Lower the layers of a run of identical modules (`bridge.repeated_blocks`) as one loop.

A captured step holds each layer's ops once per layer: the forward ops the layer's call
made, and the ops computing their gradients. Where the layers' ops are the same program
(the same ops on the same shapes, each reading its own parameters, the previous layer's
result and values shared by all), `plan` makes a `Loop` of them: the first layer's ops
become the body of one `jax.lax.scan` over the layers' stacked inputs, so XLA compiles
the body once instead of once per layer. The forward layers make one loop, their
gradients another that runs from the last layer to the first.

Anything that does not fit leaves those layers unrolled, with the reason logged at INFO:
the lowered program computes exactly what the unrolled one does, random draws included
(each random op keeps the key it has unrolled).
"""
import heapq
import logging
import operator
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from bridge.node_marks import BLOCK, ENGINE, IN_BACKWARD
from bridge.ops import LOWERINGS
from bridge.stacked_state import Rows

log = logging.getLogger("bridge.scan")

# The lowering-relevant custom meta of a node (bridge.lower's NAME_SCOPE, MATMUL_POLICY):
# two layers' nodes must agree on it.
_LOWERING_META = ("bridge_name_scope", "bridge_matmul_policy")


def draws_random(node) -> bool:
    """Whether `node`'s lowering draws a key from the step's key stream (one per node)."""
    fn = LOWERINGS.get(node.target) if node.op == "call_function" else None
    return fn is not None and fn.__module__ == "bridge.ops.random"


def draw_numbers(gm: fx.GraphModule) -> dict:
    """{random node: the number of its draw from the key stream}, as the graph's own order
    numbers them when it is lowered unrolled."""
    draws = [n for n in gm.graph.nodes if draws_random(n)]
    return {n: k + 1 for k, n in enumerate(draws)}


@dataclass(eq=False)
class Loop:
    """Layers whose ops are one program: `layers[i][p]` is layer i's node at position p,
    `layers[0]` is the body. A body argument outside the body is a slot: its per-layer
    values are `slots[s]` (nodes), and `kinds[s]` is "shared" (one value for all),
    "xs" (one per layer, stacked) or ("carry", p) (the previous layer's node at p; the
    first layer to run reads the slot's own node)."""
    name: str
    layers: list
    reverse: bool
    arg_slots: dict            # (body position, argument leaf) -> slot
    slots: list
    kinds: list
    carry: list                # body positions carried to the next layer
    ys: list                   # body positions read outside the loop
    draws: dict = field(default_factory=dict)   # body position -> per-layer draw numbers
    run: str = ""              # the run of layers it loops over
    # Rematerialisation (`rematerialise`). A forward loop that `saves_inputs` keeps, per
    # layer, only what its body reads (its stacked inputs, the carried value entering each
    # layer); the gradient loop whose `forward` it is runs the forward body again, layer
    # by layer, and takes the slots in `recompute` from it: slot -> ("at", forward body
    # position) or ("in", forward carried position: the value entering the layer).
    saves_inputs: bool = False
    forward: "Loop | None" = None
    recompute: dict = field(default_factory=dict)
    # Cheap forward values computed again (`recompute_cheap`): a gradient loop's slots whose
    # per-layer values are forward ops that only view or combine element by element what
    # the gradient loop has anyway (the layer's inputs, the value entering it, forward
    # values it reads stacked) take them from its body instead of from the forward loop's
    # stacked outputs. `cheap` is slot -> forward body position; `cheap_ops` the forward
    # body positions run, in order; `cheap_known` forward body position -> the slot that
    # holds its value; `cheap_entering` forward carried position -> the slot holding the
    # value entering the layer.
    cheap: dict = field(default_factory=dict)
    cheap_ops: list = field(default_factory=list)
    cheap_known: dict = field(default_factory=dict)
    cheap_entering: dict = field(default_factory=dict)
    cheap_of: "Loop | None" = None

    @property
    def nodes(self):
        return [n for layer in self.layers for n in layer]


class _Refused(Exception):
    pass


def plan(gm: fx.GraphModule, unsupported=frozenset(), remat: bool = False,
         calls: bool = False) -> list:
    """The loops of `gm`'s marked layers, in no particular order; layers with an op in
    `unsupported` (ops whose lowering the caller does more for) stay unrolled. With
    `remat`, each run's gradient loop recomputes its forward ops (`rematerialise`). With
    `calls`, the loops are to be run by `run_calls` (layers unrolled, their body traced
    once), which neither stacks nor recomputes anything."""
    groups = _groups(gm)
    draw = draw_numbers(gm)
    loops = []
    for (run, backward), layers in sorted(groups.items()):
        name = f"{run} ({'gradients' if backward else 'forward'})"
        try:
            odd = next((n for n in (layers or [[]])[0] if n.target in unsupported), None)
            if odd is not None:
                raise _Refused(f"its op {odd.target} has its indices checked "
                               "(cstorch.backends.csx.debug.check_indices)")
            loop = _loop(name, layers, backward, draw)
            loop.run = run
            loops.append(loop)
            log.info("the %d layers of %s are %s", len(layers), name,
                     "calls of one function" if calls else "one loop")
        except _Refused as e:
            log.info("the layers of %s are %s one by one: %s", name,
                     "lowered" if calls else "compiled", e)
    if calls:
        return loops
    if remat:
        rematerialise(loops)
    else:
        recompute_cheap(loops)
    return loops


# Ops that only view their one tensor argument, and ops that return their argument's
# values: computed again per layer, they cost a layout change or a copy at most.
_VIEWS = {torch.ops.aten.permute.default, torch.ops.aten.t.default,
          torch.ops.aten.transpose.int, torch.ops.aten.view.default,
          torch.ops.aten._unsafe_view.default, torch.ops.aten.reshape.default,
          torch.ops.aten.expand.default, torch.ops.aten.unsqueeze.default,
          torch.ops.aten.squeeze.dim, torch.ops.aten.alias.default,
          torch.ops.aten.detach.default, torch.ops.aten.clone.default}
_SAME_VALUES = {torch.ops.aten.alias.default, torch.ops.aten.detach.default,
                torch.ops.aten.clone.default}
# Not element by element, but reading and writing about as much as a stacked value costs.
_CHEAP = {torch.ops.aten.native_layer_norm.default}


def _cheap(node) -> bool:
    """Whether computing `node` again costs less than stacking its value for every layer
    and reading it back: views, element-by-element ops, layer norms, getitems of their
    results and tensors made from constants; never a random draw."""
    target = node.target
    if node.op != "call_function" or draws_random(node) or \
            torch.Tag.nondeterministic_seeded in getattr(target, "tags", ()):
        return False
    if target is operator.getitem or target in _VIEWS or target in _CHEAP:
        return True
    if not isinstance(target, torch._ops.OpOverload):
        return False
    return torch.Tag.pointwise in target.tags or not node.all_input_nodes


def recompute_cheap(loops: list):
    """For each run's gradient loop, compute again in its body the forward values it reads
    that are cheap ops (`_cheap`) of what it has anyway: the layer's stacked inputs (a
    linear layer's transposed weight), values shared by all layers, the value entering
    the layer and the forward values it reads stacked. The forward loop no longer stacks
    them: for a decoder layer, its layer norms' and activation's outputs, and an
    attention's probabilities it also keeps for the softmax's gradient."""
    runs: dict = {}
    for loop in loops:
        runs.setdefault(loop.run, {})[loop.reverse] = loop
    for run, pair in sorted(runs.items()):
        fwd, bwd = pair.get(False), pair.get(True)
        if fwd is None or bwd is None or len(fwd.layers) != len(bwd.layers):
            continue
        read = _recomputable(fwd, bwd)
        known = {q: s for s, (how, q) in read.items() if how == "at"}
        entering = {p: s for s, (how, p) in read.items() if how == "in"}
        body = fwd.layers[0]
        at = {n: p for p, n in enumerate(body)}
        for q, s in list(known.items()):   # a value kept as its copy or detached alias
            node = body[q]
            if node.target in _SAME_VALUES and node.args and node.args[0] in at:
                known.setdefault(at[node.args[0]], s)
        again = set()
        for p, node in enumerate(body):
            if not _cheap(node):
                continue
            if node.target in _SAME_VALUES and p in known:
                continue   # an alias kept stacked holds the value its argument's users read
            leaves = _arguments(node)[0]
            if all(_available(fwd, p, j, leaf, at, again, known, entering)
                   for j, leaf in enumerate(leaves)):
                again.add(p)
        cheap = {s: q for s, (how, q) in read.items() if how == "at" and q in again}
        if not cheap:
            continue
        needed, todo = set(), list(cheap.values())
        while todo:
            q = todo.pop()
            if q in needed:
                continue
            needed.add(q)
            todo.extend(at[a] for a in body[q].all_input_nodes if at.get(a) in again)
        bwd.cheap, bwd.cheap_ops, bwd.cheap_of = cheap, sorted(needed), fwd
        bwd.cheap_known = {q: s for q, s in known.items() if q not in again}
        bwd.cheap_entering = entering
        kept = [p for p in fwd.ys if _read_unless_recomputed(fwd, bwd, p)]
        log.info("the gradients of %s compute %d cheap forward values again: %d of %d "
                 "stacked forward values no longer kept", run, len(cheap),
                 len(fwd.ys) - len(kept), len(fwd.ys))
        fwd.ys = kept


def _available(fwd: Loop, p: int, j: int, leaf, at: dict, again: set, known: dict,
               entering: dict) -> bool:
    """Whether argument leaf `j` of forward body position `p` is at hand in the gradient
    loop's body: a constant, a stacked or shared input of the layer, the value entering
    it, a forward value computed again or one the gradient loop reads stacked."""
    if not isinstance(leaf, fx.Node):
        return True
    slot = fwd.arg_slots.get((p, j))
    if slot is not None:
        kind = fwd.kinds[slot]
        return kind in ("xs", "shared") or kind[1] in entering
    q = at[leaf]
    return q in again or q in known


def rematerialise(loops: list):
    """Pair each run's forward loop with its gradient loop so that the forward keeps only
    each layer's inputs and the gradient loop computes the layer's forward ops again
    before its gradients: the activations the gradients read are then held for one layer
    at a time instead of being stacked for every layer."""
    runs: dict = {}
    for loop in loops:
        runs.setdefault(loop.run, {})[loop.reverse] = loop
    for run, pair in sorted(runs.items()):
        fwd, bwd = pair.get(False), pair.get(True)
        if fwd is None or bwd is None:
            log.info("the layers of %s are not rematerialised: their %s are not one loop",
                     run, "forward ops" if fwd is None else "gradients")
            continue
        if len(fwd.layers) != len(bwd.layers):
            log.info("the layers of %s are not rematerialised: %d forward layers, %d with "
                     "gradients", run, len(fwd.layers), len(bwd.layers))
            continue
        recompute = _recomputable(fwd, bwd)
        if not recompute:
            log.info("the layers of %s are not rematerialised: their gradients read no "
                     "forward value per layer", run)
            continue
        bwd.forward, bwd.recompute = fwd, recompute
        fwd.saves_inputs = True
        kept = [p for p in fwd.ys if _read_unless_recomputed(fwd, bwd, p)]
        log.info("the gradients of %s compute their forward ops again: %d of %d stacked "
                 "forward values no longer kept", run, len(fwd.ys) - len(kept), len(fwd.ys))
        fwd.ys = kept


def _recomputable(fwd: Loop, bwd: Loop) -> dict:
    """{gradient loop slot: ("at", q) or ("in", p)} for the slots whose value in layer k
    is the forward loop's op at body position q in layer k, or the carried value p
    entering layer k."""
    at = {n: (k, q) for k, layer in enumerate(fwd.layers) for q, n in enumerate(layer)}
    init = {k[1]: fwd.slots[s][0] for s, k in enumerate(fwd.kinds) if isinstance(k, tuple)}
    found = {}
    for s, kind in enumerate(bwd.kinds):
        if kind != "xs":
            continue
        values = bwd.slots[s]
        where = [at.get(v) for v in values]
        if all(w is not None and w[0] == k for k, w in enumerate(where)) \
                and len({w[1] for w in where}) == 1:
            found[s] = ("at", where[0][1])
            continue
        for p, first in init.items():
            if values[0] is first and all(where[k] == (k - 1, p) for k in range(1, len(values))):
                found[s] = ("in", p)
                break
    return found


def _read_unless_recomputed(fwd: Loop, bwd: Loop, p: int) -> bool:
    """Whether forward body position `p` is still read outside the forward loop once the
    gradient loop recomputes its `recompute` slots (the last layer's carried value leaves
    the loop as its final carry, not as a stacked output)."""
    in_bwd = {n: q for layer in bwd.layers for q, n in enumerate(layer)}
    inside = set(fwd.nodes)
    last = len(fwd.layers) - 1
    for k, layer in enumerate(fwd.layers):
        node = layer[p]
        if k == last and p in fwd.carry:
            continue
        for user in node.users:
            if user in inside:
                continue
            q = in_bwd.get(user)
            if q is None:
                return True
            leaves = pytree.tree_flatten((user.args, user.kwargs))[0]
            if any(leaf is node and bwd.arg_slots.get((q, j)) not in bwd.recompute
                   and bwd.arg_slots.get((q, j)) not in bwd.cheap
                   for j, leaf in enumerate(leaves)):
                return True
    return False


def _groups(gm) -> dict:
    """{(run, is gradient): [nodes of layer 0, of layer 1, ...]}. A sum autograd's engine
    makes (a gradient completed from two uses of a tensor, a `.grad` written) belongs to
    the layer whose gradient ops it reads that ran last."""
    tag, found = {}, {}
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        custom = node.meta.get("custom") or {}
        where, kind = custom.get(BLOCK), custom.get(IN_BACKWARD)
        if where is None and kind == ENGINE:
            inputs = {tag[a] for a in node.all_input_nodes if a in tag and tag[a][2]}
            if len({t[0] for t in inputs}) == 1:
                where = min(inputs, key=lambda t: t[1])[:2]
        if where is None:
            continue
        tag[node] = (*where, kind is not None)
        found.setdefault((where[0], kind is not None), {}).setdefault(where[1], []).append(node)
    return {key: [layers[k] for k in sorted(layers)] if sorted(layers) == list(range(len(layers)))
            else None for key, layers in found.items()}


def _same_value(a, b) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and a != a:
        return b != b
    try:
        return bool(a == b)
    except Exception:   # values without a plain equality
        return a is b


def _meta(node):
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return tuple(val.shape), val.dtype
    return pytree.tree_map(lambda v: (tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor)
                           else v, val)


def _flatten(value, leaves: list):
    """The structure of an op's arguments, their leaves appended to `leaves` in the order
    `pytree.tree_flatten` gives them, at a fraction of its cost."""
    if isinstance(value, (list, tuple)):
        return type(value), tuple(_flatten(v, leaves) for v in value)
    if isinstance(value, dict):
        return type(value), tuple(value), tuple(_flatten(v, leaves) for v in value.values())
    leaves.append(value)
    return None


def _arguments(node, check=False):
    """(leaves, structure) of the node's arguments. Leaf positions index the loop's slots
    as `pytree.tree_flatten` numbers them; `check` makes sure they agree for this node."""
    leaves = []
    spec = _flatten((node.args, node.kwargs), leaves)
    if check:
        expected = pytree.tree_leaves((node.args, node.kwargs))
        if len(expected) != len(leaves) or any(a is not b for a, b in zip(expected, leaves)):
            raise _Refused(f"op {node.name}'s arguments have a structure the loop cannot read")
    return leaves, spec


def _tensor_meta(node):
    val = node.meta.get("val")
    return (tuple(val.shape), val.dtype) if isinstance(val, torch.Tensor) else None


def _loop(name, layers, backward, draw) -> Loop:
    if layers is None or len(layers) < 2:
        raise _Refused("not every layer's ops were found")
    count = len(layers[0])
    for k, layer in enumerate(layers):
        if len(layer) != count:
            raise _Refused(f"layer {k} has {len(layer)} ops where layer 0 has {count}")
    position = {n: (k, p) for k, layer in enumerate(layers) for p, n in enumerate(layer)}
    arg_slots, slot_of, slots = {}, {}, []
    for p, body_node in enumerate(layers[0]):
        leaves0, spec0 = _arguments(body_node, check=True)
        meta0 = _meta(body_node)
        per_layer = []
        for k, layer in enumerate(layers):
            node = layer[p]
            leaves, spec = _arguments(node)
            if node.target != body_node.target or spec != spec0 or _meta(node) != meta0:
                raise _Refused(f"layer {k}'s op {node.name} ({node.target}) differs from layer "
                               f"0's {body_node.name} ({body_node.target})")
            custom, custom0 = node.meta.get("custom") or {}, body_node.meta.get("custom") or {}
            if any(custom.get(key) != custom0.get(key) for key in _LOWERING_META):
                raise _Refused(f"layer {k}'s op {node.name} is lowered under other settings")
            per_layer.append(leaves)
        for j, leaf0 in enumerate(leaves0):
            values = [leaves[j] for leaves in per_layer]
            if not isinstance(leaf0, fx.Node):
                if not all(_same_value(v, leaf0) for v in values):
                    raise _Refused(f"op {body_node.name} takes other constants in other layers")
                continue
            if position.get(leaf0, (None,))[0] == 0:   # inside the layer: its own op
                q = position[leaf0][1]
                if not all(isinstance(v, fx.Node) and position.get(v) == (k, q)
                           for k, v in enumerate(values)):
                    raise _Refused(f"op {body_node.name} reads other ops in other layers")
                continue
            if not all(isinstance(v, fx.Node) for v in values):
                raise _Refused(f"op {body_node.name} takes a constant where another takes a tensor")
            values = tuple(values)
            if values not in slot_of:
                slot_of[values] = len(slots)
                slots.append(values)
            arg_slots[(p, j)] = slot_of[values]
    kinds = [_kind(values, position, backward) for values in slots]
    carry = sorted({k[1] for k in kinds if isinstance(k, tuple)})
    _check_carries(slots, kinds, layers, backward)
    _check_no_cycle(slots, kinds, position, backward)
    ys = []
    last = 0 if backward else len(layers) - 1
    for p in range(count):
        outside = False
        for k, layer in enumerate(layers):
            users = [u for u in layer[p].users if u not in position]
            if users and not (k == last and p in carry):
                outside = True
        if outside:
            if _tensor_meta(layers[0][p]) is None:
                raise _Refused(f"a non-tensor value of op {layers[0][p].name} is read outside")
            ys.append(p)
    draws = {p: [draw[layer[p]] for layer in layers] for p in range(count)
             if layers[0][p] in draw}
    return Loop(name, layers, backward, arg_slots, slots, kinds, carry, ys, draws)


def _kind(values, position, backward):
    inside = [position.get(v) for v in values]
    if all(w is None for w in inside):
        if all(v is values[0] for v in values):
            return "shared"
        if any(_tensor_meta(v) is None for v in values):
            raise _Refused("a non-tensor value differs between layers")
        return "xs"
    step = 1 if backward else -1   # where each layer's carried value comes from
    first = len(values) - 1 if backward else 0
    if inside[first] is not None:
        raise _Refused("the layer that runs first reads another layer's op")
    ps = set()
    for k, w in enumerate(inside):
        if k == first:
            continue
        if w is None or w[0] != k + step:
            raise _Refused("a layer reads an op of a layer other than the one before it")
        ps.add(w[1])
    if len(ps) != 1:
        raise _Refused("layers read different ops of the layer before them")
    return ("carry", ps.pop())


def _check_carries(slots, kinds, layers, backward):
    first = len(layers) - 1 if backward else 0
    init = {}
    for values, kind in zip(slots, kinds):
        if not isinstance(kind, tuple):
            continue
        p = kind[1]
        if init.setdefault(p, values[first]) is not values[first]:
            raise _Refused("one carried value starts from two different values")
        if _tensor_meta(values[first]) is None or \
                _tensor_meta(values[first]) != _tensor_meta(layers[0][p]):
            raise _Refused("a carried value changes its shape or dtype from layer to layer")


def _check_no_cycle(slots, kinds, position, backward):
    """Nothing the loop reads from outside may depend on the loop's own ops."""
    sources = set()
    first = len(slots[0]) - 1 if slots and backward else 0
    for values, kind in zip(slots, kinds):
        sources.update([values[first]] if isinstance(kind, tuple) else values)
    seen, todo = set(), [u for n in position for u in n.users if u not in position]
    while todo:
        node = todo.pop()
        if node in seen:
            continue
        if node in sources:
            raise _Refused(f"{node.name}, which a layer reads, depends on an earlier layer's "
                           "result outside the layers")
        seen.add(node)
        todo.extend(node.users)


def order(gm: fx.GraphModule, loops: list) -> list:
    """The graph's nodes with each loop's nodes replaced by the loop, in an order where
    everything comes after what it reads (the graph's own order where possible)."""
    item_of = {}
    for loop in loops:
        for node in loop.nodes:
            item_of[node] = loop
    nodes = list(gm.graph.nodes)
    index = {n: i for i, n in enumerate(nodes)}
    items, deps = [], {}
    for node in nodes:
        item = item_of.get(node, node)
        if item not in deps:
            items.append(item)
            deps[item] = set()
        for a in node.all_input_nodes:
            source = item_of.get(a, a)
            if source is not item:
                deps[item].add(source)
    first = {item: index[item.layers[0][0]] if isinstance(item, Loop) else index[item]
             for item in items}
    key = {item: i for i, item in enumerate(items)}
    waiting = {item: len(d) for item, d in deps.items()}
    users = {item: [] for item in items}
    for item, d in deps.items():
        for source in d:
            users[source].append(item)
    ready = [(first[i], key[i]) for i in items if waiting[i] == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        _, k = heapq.heappop(ready)
        item = items[k]
        out.append(item)
        for user in users[item]:
            waiting[user] -= 1
            if waiting[user] == 0:
                heapq.heappush(ready, (first[user], key[user]))
    if len(out) != len(items):
        raise RuntimeError("bridge.scan_blocks: the loops' order has a cycle")
    return out


def run_loop(loop: Loop, env: dict, lower_node, rows: Rows, stream):
    """Compute `loop` with `jax.lax.scan`: read its inputs from `env` and put every value
    read outside the loop into it. `lower_node(node, env)` lowers one op; `rows` knows the
    values that are a row of a stacked array (a loop's output, a stacked state input).
    A forward loop that `saves_inputs` also puts, under the key `loop`, what its gradient
    loop needs to run its body again: its stacked inputs, the values entering each layer,
    and its draw numbers."""
    n = len(loop.layers)
    first = n - 1 if loop.reverse else 0
    carry_slots = {k[1]: s for s, k in enumerate(loop.kinds) if isinstance(k, tuple)}
    init = tuple(env[loop.slots[carry_slots[p]][first]] for p in loop.carry)
    xs_slots = _stacked_slots(loop)
    index = rows.index(n)
    xs = tuple(rows.stack([env.raw(v) for v in loop.slots[s]], index) for s in xs_slots)
    # The forward loop's stacked inputs, for its gradient loop's cheap ops to read again.
    env[("stacked inputs", loop)] = dict(zip(xs_slots, xs))
    cheap_of = loop.cheap_of
    cheap_slots = _cheap_inputs(loop)
    stacked = env.get(("stacked inputs", cheap_of), {})
    cheap_xs = tuple(stacked[s] if s in stacked else
                     rows.stack([env.raw(v) for v in cheap_of.slots[s]], index)
                     for s in cheap_slots)
    draws = _draws(loop)
    fwd = loop.forward
    again = env[fwd] if fwd is not None else ((), (), ())
    if draws or (fwd is not None and fwd.draws):
        stream.materialize()

    def step(carried, x):
        xs_values, draw_values, again_values, cheap_values = x
        slot_value = _slot_values(loop, env, xs_slots, xs_values, carried)
        if cheap_of is not None:
            _cheap_again(loop, slot_value, dict(zip(cheap_slots, cheap_values)), env,
                         lower_node)
        if fwd is not None:
            fwd_xs, entering, fwd_draws = again_values
            values = _body(fwd, _slot_values(fwd, env, _stacked_slots(fwd), fwd_xs, entering),
                           fwd_draws, lower_node, stream)
            entering = dict(zip(fwd.carry, entering))
            for s, (how, q) in loop.recompute.items():
                slot_value[s] = values[fwd.layers[0][q]] if how == "at" else entering[q]
        local = _body(loop, slot_value, draw_values, lower_node, stream)
        body = loop.layers[0]
        ys = tuple(local[body[p]] for p in loop.ys)
        if loop.saves_inputs:
            ys += tuple(carried)
        return tuple(local[body[p]] for p in loop.carry), ys

    final, ys = jax.lax.scan(step, init, (xs, draws, again, cheap_xs), reverse=loop.reverse)
    stream.count = 0   # the body's count is the body trace's own; each draw sets it again
    if loop.saves_inputs:
        env[loop] = (xs, tuple(ys[len(loop.ys):]), draws)
        ys = ys[:len(loop.ys)]
    for p, value in zip(loop.ys, ys):
        for layer, part in zip(loop.layers, rows.split(value)):
            env[layer[p]] = part
    last = 0 if loop.reverse else n - 1
    for p, value in zip(loop.carry, final):
        env[loop.layers[last][p]] = value


def run_calls(loop: Loop, env: dict, lower_node, stream):
    """Compute `loop` unrolled, as one call per layer of one jitted function of the body:
    JAX traces the body once and the StableHLO holds it once, and XLA, which inlines the
    calls before it optimises, compiles the same program as for ops lowered one by one.
    Reads its inputs from `env` and puts every value read outside the loop into it."""
    n = len(loop.layers)
    layer_order = range(n - 1, -1, -1) if loop.reverse else range(n)
    carry_slots = {k[1]: s for s, k in enumerate(loop.kinds) if isinstance(k, tuple)}
    xs_slots = [s for s, k in enumerate(loop.kinds) if k == "xs"]
    shared_slots = [s for s, k in enumerate(loop.kinds) if k == "shared"]
    draw_positions = sorted(loop.draws)
    if draw_positions:
        stream.materialize()
    key = stream.key if draw_positions else None
    body = loop.layers[0]

    def layer(carried, xs_values, shared_values, draw_values, layer_key):
        slot_value = dict(zip(shared_slots, shared_values))
        slot_value.update(zip(xs_slots, xs_values))
        carried_value = dict(zip(loop.carry, carried))
        for s, kind in enumerate(loop.kinds):
            if isinstance(kind, tuple):
                slot_value[s] = carried_value[kind[1]]
        # The body draws from the key it is given, not from the enclosing trace's.
        outer_key, stream.key = stream.key, layer_key
        try:
            local = _body(loop, slot_value, draw_values, lower_node, stream)
        finally:
            stream.key = outer_key
        return (tuple(local[body[p]] for p in loop.carry),
                tuple(local[body[p]] for p in loop.ys))

    call = jax.jit(layer)
    first = layer_order[0]
    carried = tuple(env[loop.slots[carry_slots[p]][first]] for p in loop.carry)
    shared = tuple(env[loop.slots[s][0]] for s in shared_slots)
    for k in layer_order:
        xs_values = tuple(env[loop.slots[s][k]] for s in xs_slots)
        draw_values = tuple(jnp.asarray(loop.draws[p][k], jnp.uint32) for p in draw_positions)
        carried, ys = call(carried, xs_values, shared, draw_values, key)
        for p, value in zip(loop.ys, ys):
            env[loop.layers[k][p]] = value
    stream.count = 0   # the body's count is the body trace's own; each draw sets it again
    for p, value in zip(loop.carry, carried):
        env[loop.layers[layer_order[-1]][p]] = value


def _stacked_slots(loop: Loop) -> list:
    """The slots whose per-layer values the loop takes stacked (not those it recomputes)."""
    return [s for s, k in enumerate(loop.kinds)
            if k == "xs" and s not in loop.recompute and s not in loop.cheap]


def _cheap_inputs(loop: Loop) -> list:
    """The forward loop's stacked slots that `loop`'s cheap forward ops read."""
    fwd = loop.cheap_of
    if fwd is None:
        return []
    found = {fwd.arg_slots[(p, j)] for p in loop.cheap_ops
             for j in range(len(_arguments(fwd.layers[0][p])[0]))
             if (p, j) in fwd.arg_slots}
    return sorted(s for s in found if fwd.kinds[s] == "xs")


def _cheap_again(loop: Loop, slot_value: dict, stacked: dict, env: dict, lower_node):
    """Compute the forward ops of `loop.cheap_ops` in the gradient loop's body and put
    their values in the slots of `loop.cheap`. `stacked` holds this layer's part of the
    forward loop's stacked inputs they read."""
    fwd = loop.cheap_of
    body = fwd.layers[0]
    at = {n: p for p, n in enumerate(body)}
    local = {}
    for p in loop.cheap_ops:
        node = body[p]
        values = []
        for j, leaf in enumerate(_arguments(node)[0]):
            slot = fwd.arg_slots.get((p, j))
            kind = fwd.kinds[slot] if slot is not None else None
            if kind == "xs":
                value = stacked[slot]
            elif kind == "shared":
                value = env[fwd.slots[slot][0]]
            elif kind is not None:   # carried: the value entering the layer
                value = slot_value[loop.cheap_entering[kind[1]]]
            elif isinstance(leaf, fx.Node):
                value = local[leaf] if leaf in local else slot_value[loop.cheap_known[at[leaf]]]
            else:
                value = leaf
            values.append(value)
        spec = pytree.tree_structure((node.args, node.kwargs))
        args, kwargs = pytree.tree_unflatten(values, spec)
        local[node] = lower_node(node, args, kwargs)
    for s, q in loop.cheap.items():
        slot_value[s] = local[body[q]]


def _draws(loop: Loop) -> tuple:
    """Per body position that draws random numbers (in order), its per-layer draw numbers."""
    return tuple(jnp.asarray(loop.draws[p], jnp.uint32) for p in sorted(loop.draws))


def _slot_values(loop: Loop, env: dict, xs_slots, xs_values, carried) -> dict:
    """slot -> its value in one layer: shared ones from `env`, the layer's part of the
    stacked ones, and the carried ones."""
    slot_value = {s: env[loop.slots[s][0]] for s, kind in enumerate(loop.kinds)
                  if kind == "shared"}
    slot_value.update(zip(xs_slots, xs_values))
    carried_value = dict(zip(loop.carry, carried))
    for s, kind in enumerate(loop.kinds):
        if isinstance(kind, tuple):
            slot_value[s] = carried_value[kind[1]]
    return slot_value


def _body(loop: Loop, slot_value: dict, draw_values, lower_node, stream) -> dict:
    """One layer of `loop`: every body node's value, given its slots' values and the
    layer's draw numbers."""
    draw_of = dict(zip(sorted(loop.draws), draw_values))
    local = {}
    for p, node in enumerate(loop.layers[0]):
        leaves, spec = pytree.tree_flatten((node.args, node.kwargs))
        leaves = [slot_value[loop.arg_slots[(p, j)]] if (p, j) in loop.arg_slots
                  else local[leaf] if isinstance(leaf, fx.Node) else leaf
                  for j, leaf in enumerate(leaves)]
        args, kwargs = pytree.tree_unflatten(leaves, spec)
        if p in draw_of:
            stream.count = draw_of[p] - 1
        local[node] = lower_node(node, args, kwargs)
    return local
