"""Trace the first layer of a run of identical layers; give the others copies of its ops.

Tracing a step costs about the same for every op it makes, so a model of 24 identical
decoder layers takes about 12 times as long to capture as one of 2. While `stand_ins`
is active, the first layer of each run (`bridge.repeated_blocks`) runs as usual between
identity ops that name what enters and leaves it (its inputs and tensors, its results)
and, under autograd, the gradients that enter and leave its backward; every later layer
runs as one op (`layer`) whose gradient is one op (`layer_grad`). `expand` then puts a
copy of the first layer's forward ops in place of each `layer` op and a copy of its
gradient ops in place of each `layer_grad` op, and drops the identity ops: the graph is
the one that tracing every layer gives, node for node and in the same order (random ops
included, so every layer still draws its own keys).

Whatever the copies could not reproduce raises `NotTracedOnce` (a layer called with
other arguments or shapes than the first, called twice, out of order, or whose ops
reach outside it); the caller then traces every layer, saying why at INFO.
"""
import contextlib
import operator

import torch
import torch.fx as fx
import torch.fx.traceback as fx_traceback
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import _disable_current_modes

from bridge.node_marks import BLOCK, IN_BACKWARD

_LIB = torch.library.Library("bridge_once", "DEF")
# `tag` is (session's run index) * 4 + role, or a layer's (run, layer) packed the same way.
_LIB.define("boundary(Tensor[] xs, int tag) -> Tensor[]")
_LIB.define("layer(Tensor[] xs, int run, int layer) -> Tensor[]")
_LIB.define("layer_grad(Tensor[] grads, int run, int layer) -> Tensor[]")

# What a boundary op stands between, for one run's first layer.
_IN, _OUT, _OUT_GRAD, _IN_GRAD = range(4)
# The metadata the fake implementations give their results: {run: (output metas, input
# metas)} of the session being traced.
_METAS: dict = {}


class NotTracedOnce(Exception):
    """The layers of a run cannot be traced once; the message says why."""


def _fresh(meta):
    shape, stride, dtype = meta[:3]
    return torch.empty_strided(shape, stride, dtype=dtype)


def _meta(t: torch.Tensor) -> tuple:
    return tuple(t.shape), tuple(t.stride()), t.dtype


@torch.library.register_fake("bridge_once::boundary")
def _boundary_fake(xs, tag):
    return [torch.empty_strided(x.shape, x.stride(), dtype=x.dtype) for x in xs]


@torch.library.register_fake("bridge_once::layer")
def _layer_fake(xs, run, layer):
    return [_fresh(m) for m in _METAS[run][0]]





@torch.library.register_fake("bridge_once::layer_grad")
def _layer_grad_fake(grads, run, layer):
    return [_fresh(m) for m in _METAS[run][1] if m[3]]


def _differentiable(t: torch.Tensor) -> bool:
    """Whether autograd gives `t` a gradient."""
    return t.requires_grad and (t.dtype.is_floating_point or t.dtype.is_complex)


class _Boundary(torch.autograd.Function):
    """Identity, as one op in the graph (and one more for its gradient)."""

    @staticmethod
    def forward(ctx, tag, grad_tag, *xs):
        ctx.grad_tag = grad_tag
        ctx.differentiable = [_differentiable(x) for x in xs]
        outs = torch.ops.bridge_once.boundary(list(xs), tag)
        ctx.mark_non_differentiable(*[o for o, d in zip(outs, ctx.differentiable) if not d])
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):
        taken = [g for g, d in zip(grads, ctx.differentiable) if d]
        given = iter(torch.ops.bridge_once.boundary(taken, ctx.grad_tag))
        return (None, None, *[next(given) if d else None for d in ctx.differentiable])


class _LayerCopy(torch.autograd.Function):
    """A later layer of a run: one op, and one op for its gradient."""

    @staticmethod
    def forward(ctx, run, layer, *xs):
        ctx.run, ctx.layer = run, layer
        ctx.differentiable = [_differentiable(x) for x in xs]
        outs = torch.ops.bridge_once.layer(list(xs), run, layer)
        ctx.mark_non_differentiable(*[o for o, m in zip(outs, _METAS[run][0]) if not m[3]])
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):
        taken = [g for g, m in zip(grads, _METAS[ctx.run][0]) if m[3]]
        given = iter(torch.ops.bridge_once.layer_grad(taken, ctx.run, ctx.layer))
        return (None, None, *[next(given) if d else None for d in ctx.differentiable])


def _current_block():
    return (fx_traceback.get_current_meta().get("custom") or {}).get(BLOCK)


# nn.Module's own attributes, and the forward `stand_ins` sets on each layer.
_MODULE_OWN = frozenset(vars(torch.nn.Module())) | {"forward"}


def _attributes(module) -> list:
    """(where, value) of every attribute of `module` and its submodules that a copy of
    another layer's ops would take from that layer instead: what `find_runs` compared
    (plain values, tensors' shapes) aside, tensors kept outside the parameters and
    buffers, containers, callables."""
    return [(f"{name or 'the layer'}: attribute {key!r}", value)
            for name, m in module.named_modules(remove_duplicate=False)
            for key, value in sorted(vars(m).items()) if key not in _MODULE_OWN]


def _same(a, b) -> bool:
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (type(a) is type(b) is torch.Tensor and a.shape == b.shape
                and a.dtype == b.dtype):
            return False
        # two host tensors the layers hold: compared as values, outside the capture
        with torch._C.DisableTorchFunction(), _disable_current_modes():
            return torch.equal(a, b)
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:   # values that cannot say whether they are equal
        return False


def _differing(first: list, other: list) -> str | None:
    if [w for w, _ in first] != [w for w, _ in other]:
        return "the set of its attributes"
    for (where, a), (_, b) in zip(first, other):
        if not _same(a, b):
            return where
    return None


def _tensors_of(module) -> list:
    """(table, key) of every parameter and buffer of `module` and its submodules, in order."""
    places = []
    for _, m in module.named_modules(remove_duplicate=False):
        for table in (m._parameters, m._buffers):
            places.extend((table, key) for key, t in table.items() if t is not None)
    return places


class _First:
    """What the first layer of a run was called with and returned."""

    def __init__(self, spec, plain, in_metas, out_spec, out_plain, out_metas):
        self.spec, self.plain, self.in_metas = spec, plain, in_metas
        self.out_spec, self.out_plain, self.out_metas = out_spec, out_plain, out_metas


_TENSOR = object()   # a tensor's place among a call's leaves


def _split(tree):
    """The tensors among `tree`'s leaves, its spec, and its leaves with `_TENSOR` for each
    tensor."""
    leaves, spec = pytree.tree_flatten(tree)
    tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
    plain = [_TENSOR if isinstance(x, torch.Tensor) else x for x in leaves]
    return tensors, spec, plain


def _join(spec, plain, tensors):
    given = iter(tensors)
    return pytree.tree_unflatten([next(given) if x is _TENSOR else x for x in plain], spec)


class Session:
    """The runs of one capture traced once, and the graph pass that expands them."""

    def __init__(self, runs):
        self.runs = runs
        self.first: dict = {}     # run index -> _First
        self.attributes: dict = {}    # run index -> its first layer's `_attributes`

    def _call(self, r, k, module, forward, args, kwargs):
        run = self.runs[r]
        if _current_block() != (run.label, k):
            # its ops would not be marked as the layer's: called as `layer.forward(...)`
            raise NotTracedOnce(f"{run.layer_name(k)} was called other than as a module")
        places = _tensors_of(module)
        state = [table[key] for table, key in places]
        inputs, spec, plain = _split((args, kwargs))
        metas = [_meta(t) + (t.requires_grad,) for t in inputs + state]
        if k == 0:
            if r in self.first:
                raise NotTracedOnce(f"{run.layer_name(0)} was called twice in the step")
            marked = _Boundary.apply(r * 4 + _IN, r * 4 + _IN_GRAD, *inputs, *state)
            given_in, given_state = marked[:len(inputs)], marked[len(inputs):]
            for (table, key), t in zip(places, given_state):
                table[key] = t
            self.attributes[r] = _attributes(module)
            args, kwargs = _join(spec, plain, given_in)
            versions = [t._version for t in marked]
            try:
                result = forward(*args, **kwargs)
            finally:
                for (table, key), t in zip(places, state):
                    table[key] = t
            if [t._version for t in marked] != versions:
                # the write would reach the identity op's copy, not the tensor itself
                raise NotTracedOnce(f"{run.layer_name(0)} writes in place into its argument "
                                    f"or its own tensor (a running statistic, say)")
            outs, out_spec, out_plain = _split(result)
            outs_marked = _Boundary.apply(r * 4 + _OUT, r * 4 + _OUT_GRAD, *outs)
            self.first[r] = _First(spec, plain, metas, out_spec, out_plain,
                                   [_meta(o) for o in outs])
            _METAS[self._key(r)] = ([_meta(o) + (_differentiable(o),) for o in outs],
                                    [m[:3] + (_differentiable(t),)
                                     for m, t in zip(metas, inputs + state)])
            return _join(out_spec, out_plain, list(outs_marked))
        first = self.first.get(r)
        if first is None:
            raise NotTracedOnce(f"{run.layer_name(k)} was called before {run.layer_name(0)}")
        if spec != first.spec or plain != first.plain:
            raise NotTracedOnce(f"{run.layer_name(k)} was called with other arguments than "
                                f"{run.layer_name(0)}")
        if metas != first.in_metas:
            raise NotTracedOnce(f"{run.layer_name(k)} was given tensors of other shapes, "
                                f"dtypes or requires_grad than {run.layer_name(0)}")
        differs = _differing(self.attributes[r], _attributes(module))
        if differs:
            raise NotTracedOnce(f"{run.layer_name(k)}: {differs} differs from "
                                f"{run.layer_name(0)}'s")
        outs = _LayerCopy.apply(self._key(r), k, *inputs, *state)
        return _join(first.out_spec, first.out_plain, list(outs))

    def _key(self, r):
        return id(self) * 1024 + r

    def expand(self, gm: fx.GraphModule):
        """Each `layer` and `layer_grad` op of `gm` replaced by copies of its run's first
        layer's ops, and the boundary ops dropped."""
        try:
            self._expand(gm.graph)
        except NotTracedOnce:
            raise
        except Exception as e:
            # A graph these copies were not made for: tracing every layer still works.
            raise NotTracedOnce(f"copying the first layer's ops failed ({type(e).__name__}: "
                                f"{e})") from e

    def _expand(self, graph):
        by_tag, layers, grads = {}, {}, {}
        for node in graph.nodes:
            if node.op != "call_function":
                continue
            table = {torch.ops.bridge_once.boundary.default: by_tag,
                     torch.ops.bridge_once.layer.default: layers,
                     torch.ops.bridge_once.layer_grad.default: grads}.get(node.target)
            if table is None:
                continue
            key = node.args[1] if table is by_tag else tuple(node.args[1:])
            if key in table:
                # backward() run twice over the layers (retain_graph): copies of one
                # gradient pass cannot stand for both
                raise NotTracedOnce("the step differentiates the layers more than once")
            table[key] = node
        for r, run in enumerate(self.runs):
            if r in self.first:
                _expand_run(graph, run, self._key(r), r, by_tag, layers, grads)
        for node in reversed(list(graph.nodes)):
            if node.op == "call_function" and node.target is torch.ops.bridge_once.boundary.default:
                _bypass(node)
        left = [n for n in graph.nodes if n.op == "call_function"
                and getattr(n.target, "namespace", None) == "bridge_once"]
        if left:
            raise NotTracedOnce(f"{len(left)} of its ops were left without a copy")


def _outputs(node) -> dict:
    """{index: getitem node} of a node returning a list."""
    return {u.args[1]: u for u in node.users if u.target is operator.getitem}


def _bypass(node):
    """Uses of an identity op's results read its inputs instead; the op goes."""
    for j, item in _outputs(node).items():
        item.replace_all_uses_with(node.args[0][j])
        item.graph.erase_node(item)
    node.graph.erase_node(node)


def _block(node):
    return (node.meta.get("custom") or {}).get(BLOCK)


def _ancestors(nodes) -> set:
    seen, todo = set(), list(nodes)
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        todo.extend(n.all_input_nodes)
    return seen


def _expand_run(graph, run, key, r, by_tag, layers, grads):
    label = run.label
    order = {n: i for i, n in enumerate(graph.nodes)}
    enter, leave = by_tag[r * 4 + _IN], by_tag[r * 4 + _OUT]
    entered = set(_outputs(enter).values())
    boundaries = {enter, leave} | entered | set(_outputs(leave).values())
    forward = [n for n in graph.nodes if n.op == "call_function" and _block(n) == (label, 0)
               and not (n.meta.get("custom") or {}).get(IN_BACKWARD) and n not in boundaries]
    body = set(forward)
    for n in forward:
        for a in n.all_input_nodes:
            if a not in body and a not in entered and order[a] > order[enter]:
                raise NotTracedOnce(f"{run.layer_name(0)} reads a value made after it began "
                                    f"({a.name})")
    grad_in, grad_out = by_tag.get(r * 4 + _OUT_GRAD), by_tag.get(r * 4 + _IN_GRAD)
    backward = []
    if grad_in is not None and grad_out is not None:
        before = (_ancestors([grad_in]) | set(forward) | {grad_out}
                  | set(_outputs(grad_in).values()))
        backward = [n for n in _ancestors([grad_out]) - before
                    if order[n] > order[grad_in] and n.op == "call_function"]
        backward.sort(key=order.__getitem__)
    elif (grad_in is None) != (grad_out is None):
        raise NotTracedOnce(f"the gradients of {run.layer_name(0)} do not all pass through it")
    inner = body | set(backward)
    allowed = inner | {leave, grad_out} | set(_outputs(grad_in).values() if grad_in else ())
    for n in forward + backward:
        stray = [u for u in n.users if u not in allowed]
        if stray:
            raise NotTracedOnce(f"a value {run.layer_name(0)} computes is read outside it "
                                f"({stray[0].name}), which copies of its ops cannot give")
    entered_at = {item: j for j, item in _outputs(enter).items()}
    grads_at = {item: j for j, item in _outputs(grad_in).items()} if grad_in else {}
    for (rr, k), node in sorted(layers.items()):
        if rr != key:
            continue
        env = {item: node.args[0][j] for item, j in entered_at.items()}
        _copy(graph, forward, env, node, (label, k))
        for j, item in _outputs(node).items():
            item.replace_all_uses_with(env.get(leave.args[0][j], leave.args[0][j]))
            graph.erase_node(item)
        graph.erase_node(node)
        grad_node = grads.get((key, k))
        if grad_node is None:
            continue
        env.update({item: grad_node.args[0][j] for item, j in grads_at.items()})
        _copy(graph, backward, env, grad_node, (label, k))
        for j, item in _outputs(grad_node).items():
            source = grad_out.args[0][j]
            item.replace_all_uses_with(env.get(source, source))
            graph.erase_node(item)
        graph.erase_node(grad_node)


def _copy(graph, nodes, env, where, block):
    with graph.inserting_before(where):
        for n in nodes:
            new = graph.node_copy(n, lambda a: env.get(a, a))
            new.meta = {**n.meta, "custom": {**(n.meta.get("custom") or {}), BLOCK: block}}
            env[n] = new


@contextlib.contextmanager
def stand_ins(runs):
    """While active, the layers of `runs` after the first of each run are traced as one op
    each; yields the `Session` whose `expand` the traced graph goes through."""
    session = Session(runs)
    patched = []
    for r, run in enumerate(runs):
        for k, module in enumerate(run.modules):
            original = module.forward

            def forward(*args, _r=r, _k=k, _m=module, _f=original, **kwargs):
                return session._call(_r, _k, _m, _f, args, kwargs)
            patched.append((module, "forward" in vars(module), original))
            module.forward = forward
    try:
        yield session
    finally:
        for module, own, original in patched:
            if own:
                module.forward = original
            else:
                del module.forward
        for r in range(len(runs)):
            _METAS.pop(session._key(r), None)
