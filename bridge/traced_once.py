"""Trace the first layer of a run of identical layers; give the others copies of its ops.

Tracing a step costs about the same for every op it makes, so a model of 24 identical
decoder layers takes about 12 times as long to capture as one of 2. While `stand_ins`
is active, the first layer of each run (`bridge.repeated_blocks`) runs as usual between
identity ops that name what enters and leaves it (its inputs and tensors, its results)
and, under autograd, the gradients that enter and leave its backward; its torch calls
are recorded. Every later layer's Python code runs with its torch calls checked against
the first layer's and answered from them, untraced; where all match, it computes what
the first layer computes, and it enters the graph as one op (`layer`) whose gradient is
one op (`layer_grad`). `expand` then puts a copy of the first layer's forward ops in
place of each `layer` op and a copy of its gradient ops in place of each `layer_grad`
op, and drops the identity ops: the graph is the one that tracing every layer gives,
node for node and in the same order (random ops included, so every layer still draws
its own keys).

Whatever the copies could not reproduce raises `NotTracedOnce` (a layer whose calls or
tensors differ from the first's, called twice or out of order, writing into its inputs,
or whose ops reach outside it); the caller then traces every layer, saying why at INFO.
"""
import contextlib
import operator

import torch
import torch.fx as fx
import torch.fx.traceback as fx_traceback
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
from torch.overrides import TorchFunctionMode

from bridge.node_marks import BLOCK, IN_BACKWARD

_LIB = torch.library.Library("bridge_once", "DEF")
# A boundary's `tag` is (index of the layer traced as usual) * 4 + what it stands between;
# a copy's ops take the traced layer's key (`Session._key`) and the copy's index.
_LIB.define("boundary(Tensor[] xs, int tag) -> Tensor[]")
_LIB.define("layer(Tensor[] xs, int first, int copy) -> Tensor[]")
_LIB.define("layer_grad(Tensor[] grads, int first, int copy) -> Tensor[]")

_IN, _OUT, _OUT_GRAD, _IN_GRAD = range(4)
# The metadata the fake implementations give a copy's results, by traced layer's key:
# (its results', its inputs') (shape, stride, dtype, has a gradient).
_METAS: dict = {}


class NotTracedOnce(Exception):
    """The layers of a run cannot be traced once; the message says why."""


def fake(mode, shape, stride, dtype) -> FakeTensor:
    """A fake tensor of `mode`, made on the meta device and wrapped as the mode wraps an
    op's meta results: a factory call through the mode looks up and fills its dispatch
    cache, five times the cost, and a deep model's capture makes thousands (its inputs,
    the stand-in ops' results)."""
    with unset_fake_temporarily():
        elem = torch.empty_strided(shape, stride, dtype=dtype, device="meta")
    return FakeTensor(mode, elem, torch.get_default_device())


def fresh(meta):
    """A new tensor of the shape, stride and dtype `meta` starts with (a fake one under a
    fake mode: a fake implementation's results)."""
    shape, stride, dtype = meta[:3]
    mode = torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE)
    if mode is None:
        return torch.empty_strided(shape, stride, dtype=dtype)
    return fake(mode, shape, stride, dtype)


def metadata(t: torch.Tensor) -> tuple:
    """(shape, stride, dtype) of `t`. Read with torch function handling off: through the
    capture's and the tracer's modes each read would cost more than the rest of this, and
    a capture reads them for every state tensor."""
    with torch._C.DisableTorchFunction():
        return tuple(t.shape), tuple(t.stride()), t.dtype


@torch.library.register_fake("bridge_once::boundary")
def _boundary_fake(xs, tag):
    return [torch.empty_strided(x.shape, x.stride(), dtype=x.dtype) for x in xs]


@torch.library.register_fake("bridge_once::layer")
def _layer_fake(xs, first, copy):
    return [fresh(m) for m in _METAS[first][0]]


@torch.library.register_fake("bridge_once::layer_grad")
def _layer_grad_fake(grads, first, copy):
    return [fresh(m) for m in _METAS[first][1] if m[3]]


def _requires_grad(t: torch.Tensor) -> bool:
    with torch._C.DisableTorchFunction():
        return t.requires_grad


def _differentiable(t: torch.Tensor) -> bool:
    """Whether autograd gives `t` a gradient."""
    with torch._C.DisableTorchFunction():
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
    """A layer call copying a traced one: one op, and one op for its gradient."""

    @staticmethod
    def forward(ctx, first, copy, *xs):
        ctx.first, ctx.copy = first, copy
        ctx.differentiable = [_differentiable(x) for x in xs]
        outs = torch.ops.bridge_once.layer(list(xs), first, copy)
        ctx.mark_non_differentiable(*[o for o, m in zip(outs, _METAS[first][0]) if not m[3]])
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):
        taken = [g for g, m in zip(grads, _METAS[ctx.first][0]) if m[3]]
        given = iter(torch.ops.bridge_once.layer_grad(taken, ctx.first, ctx.copy))
        return (None, None, *[next(given) if d else None for d in ctx.differentiable])


def _current_block():
    return (fx_traceback.get_current_meta().get("custom") or {}).get(BLOCK)


def _same(a, b) -> bool:
    """Whether two plain (not tensor) values are equal for all a layer can do with them."""
    if a is b:
        return True
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:   # values that cannot say whether they are equal
        return False


class _Calls(TorchFunctionMode):
    """The torch calls a layer's Python code makes, each told apart by the function, its
    plain arguments and where each tensor argument comes from: the layer's j-th input
    ("in", j), the p-th tensor result of its i-th call ("call", i, p), or else the object
    itself (a tensor the layer holds outside its parameters and buffers, a global). A
    result that is a tensor seen before (`x.to(x.dtype)` is `x`) keeps where it came from.
    An `autograd.Function` applied is one call, told apart by its class and arguments
    (its forward and backward are functions of them)."""

    def __init__(self, inputs, name):
        super().__init__()
        self.name = name
        self.where = {id(t): ("in", j) for j, t in enumerate(inputs)}
        self.objects = {("in", j): t for j, t in enumerate(inputs)}
        self.count = 0
        self.hooks = torch._C._autograd._top_saved_tensors_default_hooks(True)

    def check_hooks(self):
        # Activation checkpointing swaps saved tensors for a recompute of the layer's
        # Python in the backward pass, which copies of the traced ops cannot stand for.
        if torch._C._autograd._top_saved_tensors_default_hooks(True) is not self.hooks:
            raise NotTracedOnce(f"{self.name} runs under saved-tensor hooks (activation "
                                f"checkpointing, say)")

    def describe(self, tree):
        leaves, spec = pytree.tree_flatten(tree)
        return spec, [self.where.get(id(x), ("object", id(x))) if isinstance(x, torch.Tensor)
                      else x for x in leaves]

    def produced(self, i, out, seen=None):
        """Where the tensors of call i's result `out` come from (`seen`: as recorded),
        and `out` with each tensor seen before replaced by this layer's own."""
        results, spec = pytree.tree_flatten(out)
        if seen is None:
            # (an autograd.Function's results are its forward's, whose calls a replay skips)
            seen = [_before(self.where.get(id(t)), i) if isinstance(t, torch.Tensor) else None
                    for t in results]
        given = []
        for p, (t, known) in enumerate(zip(results, seen)):
            if known is not None:
                t = self.objects[known]
            elif isinstance(t, torch.Tensor):
                self.where[id(t)] = ("call", i, p)
                self.objects[("call", i, p)] = t
            given.append(t)
        # as it is where nothing was replaced: rebuilt, a torch.Size would be a tuple
        return seen, (out if all(k is None for k in seen) else
                      pytree.tree_unflatten(given, spec))


def _before(where, i):
    """`where` if it names an input or a result of a call before call i, else None."""
    return where if where is not None and (where[0] == "in" or where[1] < i) else None


# Calls that change a global setting rather than make a tensor: replayed, they still run.
_GLOBAL_STATE = {torch._C._set_grad_enabled}


def _shown(leaves) -> str:
    text = ", ".join(repr(x) if not isinstance(x, tuple) else
                     ("tensor " + "/".join(map(str, x)) if x[0] != "object" else "a tensor")
                     for x in leaves)
    return f"({text[:200]})"


class _Recording(_Calls):
    """The first layer's calls, made as usual and written down: (function, arguments'
    spec and leaves, result, where each tensor of the result came from if it is not new,
    the index of the next call: after an autograd.Function, the calls its forward made
    are skipped when replayed)."""

    def __init__(self, inputs, name):
        super().__init__(inputs, name)
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return self.call(func, lambda: func(*args, **(kwargs or {})), args, kwargs or {})

    def call(self, func, run, args, kwargs):
        self.check_hooks()
        i = self.count
        spec, leaves = self.describe((args, kwargs))
        self.calls.append(None)
        self.count += 1
        out = run()
        seen, _ = self.produced(i, out)
        self.calls[i] = (func, spec, leaves, out, seen, self.count)
        return out


class _Replay(_Calls):
    """A later layer's calls checked against the first layer's, each answered with the
    first layer's result instead of being traced: where every call is the same, the
    layer's ops are the first layer's ops on its own inputs."""

    def __init__(self, inputs, recording: _Recording, name: str):
        super().__init__(inputs, name)
        self.recording = recording

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return self.call(func, None, args, kwargs or {})

    def call(self, func, run, args, kwargs):
        self.check_hooks()
        calls = self.recording.calls
        i = self.count
        if i >= len(calls) or calls[i][0] != func:   # a getter is a new object each time
            raise NotTracedOnce(f"{self.name} makes other torch calls than the first layer "
                                f"(call {i + 1}: {getattr(func, '__name__', func)})")
        _, spec, leaves, out, seen, following = calls[i]
        got_spec, got = self.describe((args, kwargs))
        differs = got_spec != spec or len(got) != len(leaves)
        for a, b in zip(got, leaves):
            if differs:
                break
            differs = not (a == b if isinstance(a, tuple) else _same(a, b))
        if differs:
            raise NotTracedOnce(f"{self.name} calls {getattr(func, '__name__', func)} with "
                                f"other arguments than the first layer (call {i + 1}: "
                                f"{_shown(got)} against {_shown(leaves)})")
        if func in _GLOBAL_STATE:
            func(*args, **kwargs)   # a setting later Python may look at
        self.count = following
        return self.produced(i, out, seen)[1]


_ACTIVE: list = []   # the _Calls of the layer call running, innermost last
_APPLY = torch.autograd.Function.__dict__["apply"]


def _apply(cls, *args, **kwargs):
    """`autograd.Function.apply` while layers are traced once: one call of the layer."""
    if not _ACTIVE or cls in (_Boundary, _LayerCopy):
        return _APPLY.__func__(cls, *args, **kwargs)
    return _ACTIVE[-1].call(cls, lambda: _APPLY.__func__(cls, *args, **kwargs), args, kwargs)


def _tensors_of(module) -> list:
    """(table, key) of every parameter and buffer of `module` and its submodules, in order."""
    places = []
    for _, m in module.named_modules(remove_duplicate=False):
        for table in (m._parameters, m._buffers):
            places.extend((table, key) for key, t in table.items() if t is not None)
    return places


class _First:
    """A layer traced as usual, which later layers' calls are copies of: its index among
    the session's (`t`), its run and layer, its call's spec and tensors, its torch calls,
    and its result's spec, plain values and where its tensors come from."""

    def __init__(self, t, run, k, spec, in_metas, recording, out_spec, out_plain, out_where):
        self.t, self.run, self.k = t, run, k
        self.spec, self.in_metas, self.recording = spec, in_metas, recording
        self.out_spec, self.out_plain, self.out_where = out_spec, out_plain, out_where


def _run(forward, spec, plain, inputs, places, tensors, mode):
    """`forward` on `inputs` (in the places of a call's tensors) with the layer's own
    tensors at `places` swapped for `tensors` while it runs, under `mode`."""
    args, kwargs = _join(spec, plain, inputs)
    before = [table[key] for table, key in places]
    for (table, key), t in zip(places, tensors):
        table[key] = t
    _ACTIVE.append(mode)
    try:
        with mode:
            return forward(*args, **kwargs)
    finally:
        _ACTIVE.pop()
        for (table, key), t in zip(places, before):
            table[key] = t


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
        self.firsts: list = []      # _First of every layer traced as usual, in order
        self.copies: list = []      # (_First, layer) of every layer call made a copy

    def _key(self, t):
        return id(self) * 1024 + t

    def _call(self, r, k, module, forward, args, kwargs):
        run = self.runs[r]
        if _current_block() != (run.label, k):
            # its ops would not be marked as the layer's: called as `layer.forward(...)`
            raise NotTracedOnce(f"{run.layer_name(k)} was called other than as a module")
        places = _tensors_of(module)
        state = [table[key] for table, key in places]
        inputs, spec, plain = _split((args, kwargs))
        metas = [metadata(t) + (_requires_grad(t),) for t in inputs + state]
        first = next((f for f in reversed(self.firsts)
                      if f.run is run and f.spec == spec and f.in_metas == metas), None)
        if first is None:
            # the first layer of the run, or one taking other tensors than those before
            # (the first layer of an nn.Sequential often takes an input without gradient)
            return self._trace(r, k, forward, places, state, inputs, spec, plain, metas)
        # Its Python code runs, its torch calls answered from the first layer's: equal
        # calls (plain arguments included, such as a layer index) mean equal ops.
        first_name = run.layer_name(first.k)
        replay = _Replay(inputs + state, first.recording, run.layer_name(k))
        try:
            result = _run(forward, spec, plain, inputs, (), (), replay)
        except NotTracedOnce:
            raise
        except Exception as e:
            # (an error of the layer's own is raised again when it is traced as usual)
            raise NotTracedOnce(f"{run.layer_name(k)} could not be checked against "
                                f"{first_name} ({type(e).__name__}: {e})") from e
        outs, out_spec, out_plain = _split(result)
        if (replay.count != len(first.recording.calls) or out_spec != first.out_spec
                or replay.describe(outs)[1] != first.out_where
                or not all(_same(a, b) for a, b in zip(out_plain, first.out_plain))):
            raise NotTracedOnce(f"{run.layer_name(k)} computes otherwise than {first_name} "
                                f"(its torch calls or its results differ)")
        self.copies.append((first, k))
        outs = _LayerCopy.apply(self._key(first.t), len(self.copies) - 1, *inputs, *state)
        return _join(first.out_spec, first.out_plain, list(outs))

    def _trace(self, r, k, forward, places, state, inputs, spec, plain, metas):
        """The layer traced as usual between identity ops, its torch calls recorded."""
        run, t = self.runs[r], len(self.firsts)
        if t >= 1024:
            raise NotTracedOnce(f"{run.layer_name(k)} was called with other tensors than "
                                f"each of a thousand layer calls traced before it")
        marked = _Boundary.apply(t * 4 + _IN, t * 4 + _IN_GRAD, *inputs, *state)
        versions = [x._version for x in marked]
        recording = _Recording(marked, run.layer_name(k))
        result = _run(forward, spec, plain, marked[:len(inputs)], places,
                      marked[len(inputs):], recording)
        if [x._version for x in marked] != versions:
            # the write would reach the identity op's copy, not the tensor itself
            raise NotTracedOnce(f"{run.layer_name(k)} writes in place into its argument or "
                                f"its own tensor (a running statistic, say)")
        outs, out_spec, out_plain = _split(result)
        self.firsts.append(_First(t, run, k, spec, metas, recording, out_spec, out_plain,
                                  recording.describe(outs)[1]))
        _METAS[self._key(t)] = ([metadata(o) + (_differentiable(o),) for o in outs],
                                [m[:3] + (_differentiable(x),)
                                 for m, x in zip(metas, inputs + state)])
        outs_marked = _Boundary.apply(t * 4 + _OUT, t * 4 + _OUT_GRAD, *outs)
        return _join(out_spec, out_plain, list(outs_marked))

    def expand(self, gm: fx.GraphModule):
        """Each `layer` and `layer_grad` op of `gm` replaced by copies of the ops of the
        layer it copies, and the boundary ops dropped."""
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
            key = node.args[1] if table is by_tag else node.args[2]
            if key in table:
                # backward() run twice over the layers (retain_graph): copies of one
                # gradient pass cannot stand for both
                raise NotTracedOnce("the step differentiates the layers more than once")
            table[key] = node
        for first in self.firsts:
            copies = [(c, k) for c, (f, k) in enumerate(self.copies) if f is first]
            if copies:
                _expand_copies(graph, first, copies, by_tag, layers, grads)
        for node in reversed(list(graph.nodes)):
            if node.op == "call_function" and node.target is torch.ops.bridge_once.boundary.default:
                bypass(node)
        left = [n for n in graph.nodes if n.op == "call_function" and _ours(n)]
        if left:
            raise NotTracedOnce(f"{len(left)} of its ops were left without a copy")


def outputs_of(node) -> dict:
    """{index: getitem node} of a node returning a list."""
    return {u.args[1]: u for u in node.users if u.target is operator.getitem}


def bypass(node):
    """Uses of an identity op's results read its inputs instead; the op goes."""
    for j, item in outputs_of(node).items():
        item.replace_all_uses_with(node.args[0][j])
        item.graph.erase_node(item)
    node.graph.erase_node(node)


def _ours(node) -> bool:
    """Whether `node` is one of this module's ops (a later call of the same layer, say)."""
    return getattr(node.target, "namespace", None) == "bridge_once"


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


def _expand_copies(graph, first, copies, by_tag, layers, grads):
    """The copies (copy index, layer) of `first`: each `layer` op replaced by its forward
    nodes, each `layer_grad` op by its gradient nodes."""
    run, t, label = first.run, first.t, first.run.label
    name = run.layer_name(first.k)
    order = {n: i for i, n in enumerate(graph.nodes)}
    enter, leave = by_tag[t * 4 + _IN], by_tag[t * 4 + _OUT]
    entered = set(outputs_of(enter).values())
    boundaries = {enter, leave} | entered | set(outputs_of(leave).values())
    # The ops its call made lie between the two identity ops (a layer traced twice, on
    # other tensors each time, has the same mark on both calls' ops).
    forward = [n for n in graph.nodes if n.op == "call_function" and _block(n) == (label, first.k)
               and order[enter] < order[n] < order[leave]
               and not (n.meta.get("custom") or {}).get(IN_BACKWARD) and n not in boundaries
               and not _ours(n) and not (n.target is operator.getitem and _ours(n.args[0]))]
    body = set(forward)
    for n in forward:
        for a in n.all_input_nodes:
            # a constant's node is made where it is first used, and reads nothing
            if a not in body and a not in entered and a.op == "call_function" \
                    and order[a] > order[enter]:
                raise NotTracedOnce(f"{name} reads a value made after it began "
                                    f"({a.name})")
    grad_in, grad_out = by_tag.get(t * 4 + _OUT_GRAD), by_tag.get(t * 4 + _IN_GRAD)
    backward = []
    if grad_in is not None and grad_out is not None:
        before = (_ancestors([grad_in]) | set(forward) | {grad_out}
                  | set(outputs_of(grad_in).values()))
        backward = [n for n in _ancestors([grad_out]) - before
                    if order[n] > order[grad_in] and n.op == "call_function"]
        backward.sort(key=order.__getitem__)
    elif (grad_in is None) != (grad_out is None):
        raise NotTracedOnce(f"the gradients of {name} do not all pass through it")
    inner = body | set(backward)
    allowed = inner | {leave, grad_out} | set(outputs_of(grad_in).values() if grad_in else ())
    for n in forward + backward:
        stray = [u for u in n.users if u not in allowed]
        if stray:
            raise NotTracedOnce(f"a value {name} computes is read outside it "
                                f"({stray[0].name}), which copies of its ops cannot give")
    entered_at = {item: j for j, item in outputs_of(enter).items()}
    grads_at = {item: j for j, item in outputs_of(grad_in).items()} if grad_in else {}
    for c, k in copies:
        node = layers[c]
        env = {item: node.args[0][j] for item, j in entered_at.items()}
        _copy(graph, forward, env, node, (label, k))
        for j, item in outputs_of(node).items():
            item.replace_all_uses_with(env.get(leave.args[0][j], leave.args[0][j]))
            graph.erase_node(item)
        graph.erase_node(node)
        grad_node = grads.get(c)
        if grad_node is None:
            continue
        env.update({item: grad_node.args[0][j] for item, j in grads_at.items()})
        _copy(graph, backward, env, grad_node, (label, k))
        for j, item in outputs_of(grad_node).items():
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
    """While active, a call of a layer of `runs` that is like one traced before it (the
    same tensors, the same torch calls) is not traced but taken as one op; yields the
    `Session` whose `expand` the traced graph goes through."""
    session = Session(runs)
    if runs:
        torch.autograd.Function.apply = classmethod(_apply)
    patched = []
    for r, run in enumerate(runs):
        for k, module in enumerate(run.modules):
            patched.append((module, "forward" in vars(module), module.forward))
            module.forward = _routed(session, r, k, module, module.forward)
    try:
        yield session
    finally:
        torch.autograd.Function.apply = _APPLY
        for module, own, original in patched:
            if own:
                module.forward = original
            else:
                del module.forward
        for first in session.firsts:
            _METAS.pop(session._key(first.t), None)


def _routed(session, r, k, module, forward):
    def routed(*args, **kwargs):
        return session._call(r, k, module, forward, args, kwargs)
    return routed
