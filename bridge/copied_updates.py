"""Trace an update rule once per kind of alike tensors; give the others copies of its ops.

An optimizer's rule updates each parameter on its own: where two parameters and their
states have the same shapes, strides and dtypes, their updates are the same ops on other
tensors. Tracing costs about the same for every tensor an op makes, so a deep model's
optimizer step (24 decoder layers: some 290 parameters, with four state tensors each under
AdamW) took most of its capture tracing the same update again and again. While a
`Session` is active (`copies`), `Session.apply` traces the rule for the first member of
each kind between two identity ops (`enter`, `leave`) and lets one op (`copy`) stand for
all the other members of that kind; each member's tensors are given their new values as
the rule's in-place writes would have given them. `Session.expand` then widens each of
the first member's foreach ops by every other member's elements (so the program holds one
such op per rule and kind, as a grouped update would), copies any other op once per member,
and drops the identity ops. Each member computes with the same ATen ops as before, so
results are bit for bit the same.

What copies could not reproduce raises `NotCopied`: an update that draws random
numbers, adds or removes state, changes a tensor's shape, writes into a tensor the members
share, or whose values are read outside it. The caller then traces every update.
"""
import contextlib
import contextvars
import operator
from collections.abc import Callable

import torch
import torch.fx as fx
from torch._subclasses.functional_tensor import FunctionalTensor

from bridge.traced_once import NotTracedOnce, bypass, fresh, metadata, outputs_of

_LIB = torch.library.Library("bridge_updates", "DEF")
_LIB.define("enter(Tensor[] xs, int kind) -> Tensor[]")
_LIB.define("leave(Tensor[] xs, int kind) -> Tensor[]")
# `copy` takes the tensors of every member but the first, one member after another.
_LIB.define("copy(Tensor[] xs, int kind) -> Tensor[]")

# By kind: the (shape, stride, dtype) of each value `leave` takes, which a `copy` op gives
# for each member it stands for, and how many tensors a member has.
_METAS: dict = {}
# A kind of fewer members is updated with the parameters of shapes of their own: tracing
# the first member's update, standing in for the others and widening the ops after
# tracing cost more than tracing two or three members did (docs/benchmarks.md).
MIN_MEMBERS = 4
_current = contextvars.ContextVar("bridge_copied_updates", default=None)


class NotCopied(NotTracedOnce):
    """An update cannot be copied from one member to the others; the message says why."""


@torch.library.register_fake("bridge_updates::enter")
def _enter_fake(xs, kind):
    return [fresh(metadata(x)) for x in xs]


@torch.library.register_fake("bridge_updates::leave")
def _leave_fake(xs, kind):
    return [fresh(metadata(x)) for x in xs]


@torch.library.register_fake("bridge_updates::copy")
def _copy_fake(xs, kind):
    metas = _METAS[kind][0]
    return [fresh(m) for _ in range(len(xs) // _METAS[kind][1]) for m in metas]


def current():
    """The active `Session`, or None outside `copies`."""
    return _current.get()


class Session:
    """The kinds traced in one capture, and the graph pass that expands their copies."""

    def __init__(self):
        self.kinds: list = []   # the keys of the kinds traced once

    def apply(self, update: Callable[[list], list], members: list, shared=()):
        """Run `update` for every member, tracing it once per kind of alike members.

        `members` are (structure, tensors) pairs: members of one structure whose tensors
        have the same shapes, strides and dtypes are alike. ``update(batch)`` takes a list
        of such pairs, updates their tensors in place or makes new ones, and returns each
        member's tensors after it, in the order given. `shared` are tensors every member's
        update may read but none may write (the hyperparameters)."""
        seen = set()
        for _, tensors in members:
            for t in tensors:
                if id(t) in seen:
                    raise NotCopied("two members of an update share a tensor")
                seen.add(id(t))
        kinds: dict = {}
        for member in members:
            structure, tensors = member
            kinds.setdefault((structure, tuple(metadata(t) for t in tensors)), []).append(member)
        before = _values(shared)
        singles = [m for ms in kinds.values() if len(ms) < MIN_MEMBERS for m in ms]
        if singles:
            rebound = [(t, v) for (_, tensors), after in zip(singles, update(singles))
                       for t, v in zip(tensors, after) if v is not t]
            _write([t for t, _ in rebound], [v for _, v in rebound])
        for alike in (ms for ms in kinds.values() if len(ms) >= MIN_MEMBERS):
            self._once(update, alike)
        if any(a is not b for a, b in zip(_values(shared), before)):
            raise NotCopied("the update writes into a tensor its members share")

    def _once(self, update, alike):
        kind = id(self) * 4096 + len(self.kinds)
        if len(self.kinds) >= 4096:
            raise NotCopied("more than 4096 kinds of alike tensors")
        structure, first = alike[0]
        entered = list(torch.ops.bridge_updates.enter(first, kind))
        before = _values(entered)
        after = update([(structure, entered)])[0]
        written = [j for j, (x, y, now) in enumerate(zip(entered, after, _values(entered)))
                   if y is not x or now is not before[j]]
        if not written:
            return
        self.kinds.append(kind)
        _METAS[kind] = ([metadata(after[j]) for j in written], len(first))
        # One op stands for all the other members, one write gives every member its values.
        left = torch.ops.bridge_updates.leave([after[j] for j in written], kind)
        copied = torch.ops.bridge_updates.copy([t for _, ts in alike[1:] for t in ts], kind)
        _write([ts[j] for _, ts in alike for j in written], [*left, *copied])

    def expand(self, gm: fx.GraphModule):
        """Each `copy` op of `gm` replaced by its members' ops, and the identity ops
        dropped."""
        try:
            self._expand(gm.graph)
        except NotCopied:
            raise
        except Exception as e:
            # A graph these copies were not made for: tracing every update still works.
            raise NotCopied(f"copying an update's ops failed ({type(e).__name__}: "
                            f"{e})") from e

    def _expand(self, graph):
        ops = torch.ops.bridge_updates
        enters, leaves, copies = {}, {}, {}
        for node in graph.nodes:
            if node.op == "call_function" and node.target is ops.enter.default:
                enters[node.args[1]] = node
            elif node.op == "call_function" and node.target is ops.leave.default:
                leaves[node.args[1]] = node
            elif node.op == "call_function" and node.target is ops.copy.default:
                copies.setdefault(node.args[1], []).append(node)
        for kind in self.kinds:
            _expand_kind(graph, enters[kind], leaves[kind], copies.get(kind, []))
        for node in reversed(list(graph.nodes)):
            if node.op == "call_function" and node.target in (ops.enter.default,
                                                              ops.leave.default):
                bypass(node)
        left = [n for n in graph.nodes
                if getattr(n.target, "namespace", None) == "bridge_updates"]
        if left:
            raise NotCopied(f"{len(left)} update ops were left without a copy")


def _write(targets, values):
    """Each target given its new value, as the rule's in-place writes would have given it."""
    if any(metadata(v) != metadata(t) for t, v in zip(targets, values)):
        raise NotCopied("the update changes a tensor's shape, stride or dtype")
    if all(isinstance(t, FunctionalTensor) for t in targets + values):
        # What functionalisation does for an in-place op, without tracing a copy per tensor.
        for t, v in zip(targets, values):
            t.replace_(torch._from_functional_tensor(v.elem))
            t.commit_update()
    elif targets:
        torch._foreach_copy_(targets, values)


def _values(tensors) -> list:
    """The values functional tensors hold now: an op writing into one gives it another."""
    return [torch._from_functional_tensor(t.elem) if isinstance(t, FunctionalTensor) else t
            for t in tensors]


def _expand_kind(graph, enter, leave, copies):
    entered = {item: j for j, item in outputs_of(enter).items()}
    # The traced member's ops: those after `enter` that read what it entered, directly or
    # through one another. Others made meanwhile (a hyperparameter's complement) read
    # only shared values and stay where they are, before every copy.
    body, inside = [], set(entered)
    node = enter.next
    while node is not leave:
        if node.op == "call_function" and any(a in inside for a in node.all_input_nodes):
            body.append(node)
            inside.add(node)
        node = node.next
    for node in body:
        if _draws_random(node):
            raise NotCopied("the update draws random numbers, which copies would not")
        stray = [u for u in node.users if u not in inside and u is not leave]
        if stray:
            raise NotCopied(f"a value the update computes is read outside it "
                            f"({stray[0].name})")
    if not copies:
        return
    (node,) = copies
    size, count = len(enter.args[0]), len(leave.args[0])
    given = node.args[0]
    envs = [{item: given[m * size + j] for item, j in entered.items()}
            for m in range(len(given) // size)]
    _widen_or_copy(graph, body, inside, envs)
    outputs, replaced = outputs_of(node), {}
    for m, env in enumerate(envs):
        for k in range(count):
            item = outputs.get(m * count + k)
            if item is not None:
                source = leave.args[0][k]
                replaced[item] = env.get(source, source)
    # One pass over each reader: most are the graph's output, which lists every state
    # value, and replacing its inputs one at a time would scan it once per value.
    for user in {u for item in replaced for u in item.users}:
        user.args = fx.map_arg(user.args, lambda a: replaced.get(a, a))
        user.kwargs = fx.map_arg(user.kwargs, lambda a: replaced.get(a, a))
    for item in replaced:
        graph.erase_node(item)
    graph.erase_node(node)


def _widen_or_copy(graph, body, inside, envs):
    """Every member's ops beside the traced member's: a foreach op's lists widened by each
    member's elements (the program then holds one foreach op per rule and kind, as a
    grouped update would have), any other op copied once per member right after it."""
    widened = set()
    for n in body:
        if n in widened:
            continue
        if _widenable(n, inside):
            _widen(graph, n, envs, widened)
            continue
        anchor = n
        for env in envs:
            with graph.inserting_after(anchor):
                anchor = env[n] = graph.node_copy(n, lambda a, env=env: env.get(a, a))
                anchor.meta = dict(n.meta)


def _widenable(node, inside) -> bool:
    """A foreach op whose arguments other than its lists are not the member's own."""
    if not _is_foreach(node):
        return False
    lists = [a for a in node.args if isinstance(a, (list, tuple))]
    others = [a for a in node.args if not isinstance(a, (list, tuple))]
    others += list(node.kwargs.values())
    return bool(lists) and not any(isinstance(a, fx.Node) and a in inside for a in others) \
        and len({len(a) for a in lists}) == 1 \
        and all(u.target is operator.getitem for u in node.users)


def _widen(graph, node, envs, widened):
    length = len(next(a for a in node.args if isinstance(a, (list, tuple))))
    node.args = tuple([*a, *[env.get(x, x) for env in envs for x in a]]
                      if isinstance(a, (list, tuple)) else a for a in node.args)
    val = node.meta.get("val")
    if isinstance(val, (list, tuple)):
        node.meta["val"] = [*val, *[v for _ in envs for v in val]]
    items = outputs_of(node)
    anchor = node
    for m, env in enumerate(envs):
        for i, item in sorted(items.items()):
            with graph.inserting_after(anchor):
                anchor = env[item] = graph.call_function(operator.getitem,
                                                         (node, (m + 1) * length + i))
                anchor.meta = dict(item.meta)
            widened.add(item)


def _is_foreach(node) -> bool:
    return node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload) \
        and node.target._schema.name.startswith("aten::_foreach_")


def _draws_random(node) -> bool:
    tags = getattr(node.target, "tags", ()) or ()
    return torch.Tag.nondeterministic_seeded in tags


@contextlib.contextmanager
def copies():
    """While active, `current()` is a fresh `Session`; yields it."""
    session = Session()
    token = _current.set(session)
    try:
        yield session
    finally:
        _current.reset(token)
        for kind in session.kinds:
            _METAS.pop(kind, None)
