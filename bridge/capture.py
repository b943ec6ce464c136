"""Capture a Python training step as one functional graph of core ATen ops.

`make_fx` runs the step once on fake tensors with autograd live, so forward, backward and
the in-place optimizer update all land in one graph. The ops autograd dispatches pass, in
order, through functionalisation (mutations become new values), the core-ATen
decomposition table (composite ops become core ops) and the tracer, as AOTAutograd stacks
them: one pass over the user's code gives the functional core-ATen graph. The result is a
pure function (inputs) -> (outputs) that `bridge.lower` turns into JAX.
"""
import contextlib
import logging
import os
import sys
import time
from dataclasses import dataclass
from collections.abc import Callable, Sequence

import torch
import torch.fx as fx
import torch.fx.traceback as fx_traceback
import torch.utils._pytree as pytree
from torch._prims_common import make_contiguous_strides_for
from torch._subclasses.fake_tensor import (DataDependentOutputException,
                                           DynamicOutputShapeException, FakeTensor,
                                           FakeTensorMode)
from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode
from torch.fx._lazy_graph_module import _use_lazy_graph_module
from torch.fx.experimental import proxy_tensor
from torch.fx.experimental.proxy_tensor import make_fx
from torch.overrides import TorchFunctionMode

from bridge import eager_errors
from bridge.decomposition_table import decompositions
from bridge.errors import (GRADIENT_OF, CaptureError, DataDependentShapeError,
                           TensorValueReadError)
from bridge.lower import check_lowerable
from bridge.node_marks import ENGINE, GRADIENT_OP, IN_BACKWARD
from bridge.ops.recurrent import route as route_recurrent
from bridge.traced_once import NotTracedOnce, fake
from bridge.user_line import (NO_USER_FRAME, anchor_stack_traces, stack_trace, user_code,
                              with_user_line)

_Tensor = torch.Tensor
# Every way Python code can look at a tensor's contents.
_VALUE_READS = {
    _Tensor.item, _Tensor.tolist, _Tensor.numpy, _Tensor.__bool__, _Tensor.__float__,
    _Tensor.__int__, _Tensor.__index__, _Tensor.__repr__, _Tensor.__str__, _Tensor.__format__,
    _Tensor.__array__,
}
# Queries of a tensor's metadata: they record nothing, and the tracer's own bookkeeping
# makes most of the torch calls a capture sees.
_METADATA = {
    *(getattr(_Tensor, name).__get__ for name in (
        "layout", "shape", "dtype", "device", "requires_grad", "is_quantized", "ndim",
        "is_sparse")),
    _Tensor.stride, _Tensor.size, _Tensor.dim, _Tensor.numel, _Tensor.storage_offset,
    _Tensor.is_contiguous,
}
_TRACED = (FakeTensor, FunctionalTensor)


def _traced(t: torch.Tensor) -> bool:
    """Whether `t` is the capture's own (fake, or functional over fake), not a real tensor.
    Inside `torch.vmap` the step's tensors arrive wrapped (batched) by functorch."""
    while torch._C._functorch.is_functorch_wrapped_tensor(t):
        t = torch._C._functorch.get_unwrapped(t)
    return isinstance(t, _TRACED) or torch._is_functional_tensor(t)


class _CaptureMode(TorchFunctionMode):
    """Refuses value reads; hands every real (not traced) tensor argument to `tensor_hook`,
    which returns what the op should see instead (its traced stand-in) or raises.

    It also takes `nn.LSTM`/`nn.GRU`/`nn.RNN` calls before ATen sees them: on CPU
    `aten.lstm` would pick an opaque oneDNN kernel, and the non-oneDNN path unrolls every
    time step into the graph; `bridge.ops.recurrent` keeps one scanned op per layer."""

    def __init__(self, hint: str, tensor_hook=None):
        super().__init__()
        self.hint = hint
        self.tensor_hook = tensor_hook

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _METADATA and _traced(args[0]):
            return func(*args, **kwargs)
        if func in _VALUE_READS:
            # FunctionalTensor's own `__bool__` and `tolist` read through `item`.
            name = (func is _Tensor.item and _functional_value_read()) or func.__name__
            raise TensorValueReadError(_value_read(name, self.hint))
        if isinstance(kwargs.get("generator"), torch.Generator):
            raise CaptureError(_explicit_generator(func))
        real = []

        def stand_in(t):
            if _traced(t):
                return t
            t = t if self.tensor_hook is None else self.tensor_hook(t)
            if not _traced(t):
                real.append(t)
            return t

        if not _all_traced(args, kwargs):
            args, kwargs = pytree.tree_map_only(torch.Tensor, stand_in, (args, kwargs))
        _refuse_write_into_constant(func, args, kwargs)
        if real:
            # A real tensor the step closed over becomes a constant of the graph; wrapped,
            # what the step derives from it is functionalised like everything else.
            args, kwargs = pytree.tree_map_only(
                torch.Tensor, lambda t: t if _traced(t) else _functional_constant(t),
                (args, kwargs))
        # Raised here, the user's frames stay in the traceback; `from None` drops the fake
        # tensor internals that would bury them.
        meta = fx_traceback.get_current_meta() if fx_traceback.has_preserved_node_meta() else {}
        outer_trace = meta.get("stack_trace")
        own_trace = outer_trace is None or outer_trace == NO_USER_FRAME
        if own_trace:
            meta["stack_trace"] = stack_trace() or NO_USER_FRAME
        try:
            if func in _BACKWARD_CALLS:
                return _backward(func, args, kwargs, self.hint)
            if eager_errors.suspect(func, args, kwargs):
                _raise_as_eager(eager_errors.eager_error(func, args, kwargs))
            recurrent = route_recurrent(func, args, kwargs)
            if recurrent is not None:
                return recurrent()
            return func(*args, **kwargs)
        except DynamicOutputShapeException as e:
            raise DataDependentShapeError(_data_dependent(func, e)) from None
        except DataDependentOutputException:
            raise TensorValueReadError(_value_read(_name_of(func), self.hint)) from None
        except (CaptureError, NotTracedOnce):
            raise
        except Exception as e:
            # Where eager PyTorch refuses the call too, its own words say what is wrong.
            if not getattr(e, "raised_as_eager", False):
                _raise_as_eager(eager_errors.eager_error(func, args, kwargs))
            raise
        finally:
            if own_trace:
                meta["stack_trace"] = outer_trace
                if outer_trace is None:
                    del meta["stack_trace"]


# Arguments pytree sees as leaves, which `_all_traced` may pass over.
_LEAVES = frozenset({int, float, bool, complex, str, type(None), slice, type(...), torch.dtype,
                     torch.device, torch.layout, torch.memory_format})


def _all_traced(args, kwargs) -> bool:
    """Whether every tensor among `args` and `kwargs` is the capture's own, found without
    pytree where they are tensors, leaves and plain lists or tuples of them: pytree's walk
    over a foreach op's lists (a thousand state tensors in a deep model's optimizer step)
    cost more than the op's trace. Anything else is left to pytree (False)."""
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            if not _traced(a):
                return False
        elif type(a) is list or type(a) is tuple:
            for x in a:
                if isinstance(x, torch.Tensor):
                    if not _traced(x):
                        return False
                elif type(x) not in _LEAVES:
                    return False
        elif type(a) not in _LEAVES:
            return False
    return True


def _raise_as_eager(error):
    if error is not None:
        raised = eager_errors.as_raised_by_eager(error, with_user_line(str(error)))
        raised.raised_as_eager = True   # not to be looked into again by an outer call
        raise raised from None


def _functional_value_read() -> str | None:
    """`__bool__` or `tolist` when one of FunctionalTensor's is reading a value through
    `item` below this frame's caller."""
    frame = sys._getframe(2)
    for _ in range(4):
        if frame is None:
            return None
        if frame.f_code in _FUNCTIONAL_READS:
            return _FUNCTIONAL_READS[frame.f_code]
        frame = frame.f_back
    return None


_FUNCTIONAL_READS = {FunctionalTensor.__bool__.__code__: "__bool__",
                     FunctionalTensor.tolist.__code__: "tolist"}


def _functional_constant(t: torch.Tensor) -> torch.Tensor:
    mode = torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FUNCTIONAL)
    if not isinstance(mode, _Functionalise):
        return t
    wrapped = mode.constants.get(id(t))
    if wrapped is None:
        # The tensor is kept in the entry, so its id is not reused during the capture.
        wrapped = mode.constants[id(t)] = (t, FunctionalTensor.to_functional(t))
    return wrapped[1]


class _Functionalise(FunctionalTensorMode):
    """Functionalisation for a capture. Ops that only check values a compiled step cannot
    look at (`_linalg_check_errors`, which torch marks as having side effects) are left
    out, and `constants` holds the functional stand-ins of real tensors the step uses."""

    def __init__(self):
        super().__init__()
        self.constants = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in _VALUE_CHECKS:
            return None
        if func is _DEVICE and len(args) == 1 and type(args[0]) is FakeTensor \
                and not args[0].fake_mode.in_kernel_invocation:
            # What the modes below give for a fake tensor; wrapping every state tensor as
            # a functional one asks it, and the modes' generic paths took most of the wrap.
            return args[0].fake_device
        # The torch calls functionalisation, the tracer and decompositions make to handle
        # an op are theirs, not the step's: through the capture's and the tracer's torch
        # function modes they would cost more than the op itself.
        with torch._C.DisableTorchFunction():
            return super().__torch_dispatch__(func, types, args, kwargs)


_VALUE_CHECKS = {torch.ops.aten._linalg_check_errors.default}
_DEVICE = torch.ops.prim.device.default


def _name_of(func) -> str:
    return torch.overrides.resolve_name(func) or getattr(func, "__name__", str(func))


def _value_read(name: str, hint: str) -> str:
    return with_user_line(
        f"a tensor's value was read ({name}) while the step was being traced, but tensor "
        f"values are not known until the step runs. {hint}")


def _explicit_generator(func) -> str:
    return with_user_line(
        f"{_name_of(func)} was given a torch.Generator: a compiled step draws its random "
        f"numbers from the step's own key (seeded by torch.manual_seed), which a generator "
        f"object cannot drive, nor would its state advance. Leave generator= out (seed with "
        f"torch.manual_seed for a reproducible run), or draw the numbers outside the step "
        f"and pass them in as an argument")


def _data_dependent(func, error) -> str:
    name = _name_of(func)
    what = "indexing with a boolean mask (x[mask])" if name.endswith("__getitem__") else name
    op = getattr(error, "func", None)
    return with_user_line(
        f"{what} gives a tensor whose shape depends on tensor values"
        f"{f' (ATen op {op})' if op is not None else ''}, which a compiled step cannot have: "
        "every shape must be known when the step is compiled. Use a static-shape form: "
        "torch.where(cond, a, b) to pick values, a mask to multiply by (x * mask, then a sum) "
        "to reduce over selected elements, ignore_index in a loss to skip targets, "
        "torch.topk(x, k) with a fixed k for the largest elements, or "
        "torch.nonzero_static(x, size=n) for a fixed number of indices")


_IN_PLACE_DUNDERS = {"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__",
                     "__ifloordiv__", "__imod__", "__ipow__", "__iand__", "__ior__", "__ixor__",
                     "__ilshift__", "__irshift__", "__imatmul__"}


def _refuse_write_into_constant(func, args, kwargs):
    """A write into a real tensor the step closed over (not state, not an argument) would
    be replayed on a copy baked into the program, never reaching that tensor."""
    name = getattr(func, "__name__", "")
    in_place = ((name.endswith("_") and not name.startswith("_") and name != "requires_grad_")
                or name in _IN_PLACE_DUNDERS)
    targets = [args[0] if in_place and args else kwargs.get("out")]
    if name.startswith("_foreach_") and name.endswith("_") and args:
        targets = list(args[0])
    target = next((t for t in targets if isinstance(t, torch.Tensor)
                   and not _traced(t)), None)
    if target is not None:
        raise CaptureError(with_user_line(
            f"the step writes in place ({_name_of(func)}) into a tensor of shape "
            f"{tuple(target.shape)} that it neither created nor took as an argument (a global "
            "or a closure variable); the compiled step works on a copy of such a tensor, so "
            "the write would not reach it. Pass the tensor to the step as an argument and "
            "return its new value, or write into a copy (t = t.clone())"))


_BACKWARD_CALLS = {torch.Tensor.backward, torch.autograd.backward, torch.autograd.grad}


def _backward(func, args, kwargs, hint):
    if torch.is_anomaly_enabled():
        raise CaptureError(with_user_line(
            "backward() runs under torch.autograd.detect_anomaly() (or set_detect_anomaly(True)) "
            "while the step is traced: anomaly mode checks every gradient for NaN on the host "
            "as backward runs, which a compiled step cannot do. Leave anomaly mode out of the "
            "traced step; to look for NaN, compute torch.isnan(x).any() in the step and read "
            f"it after the step. {hint}"))
    roots = args[0] if args else kwargs.get("tensors", kwargs.get("outputs"))
    with _gradients_marked(pytree.tree_leaves(roots)), \
            fx_traceback.annotate({IN_BACKWARD: ENGINE}):
        return func(*args, **kwargs)


@contextlib.contextmanager
def _gradients_marked(roots):
    """Tag what each autograd node's backward records with the node's sequence number,
    which the forward op that created the node carries as `node.meta["seq_nr"]`: an error
    about a backward op can then name the forward line it differentiates."""
    open_marks, handles = [], []

    def before(seq):
        def hook(grad_outputs):
            mark = fx_traceback.annotate({GRADIENT_OF: seq, IN_BACKWARD: GRADIENT_OP})
            mark.__enter__()
            open_marks.append(mark)
        return hook

    def after(grad_inputs, grad_outputs):
        if open_marks:
            open_marks.pop().__exit__(None, None, None)

    seen = set()
    todo = [t.grad_fn for t in roots if isinstance(t, torch.Tensor)]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        todo.extend(n for n, _ in node.next_functions)
        if not hasattr(node, "variable"):  # AccumulateGrad only writes `.grad`
            handles.append(node.register_prehook(before(node._sequence_nr())))
            handles.append(node.register_hook(after))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        while open_marks:
            open_marks.pop().__exit__(None, None, None)


# Key of `node.meta["custom"]` on forward ops: a dict of annotations that the ops
# computing their gradients get in their own `custom` meta (a precision level for the
# backward pass, say).
BACKWARD_ANNOTATIONS = "bridge_backward_annotations"


def _point_gradients_at_forward(gm: fx.GraphModule):
    """Give every node a backward recorded for a forward op that op's stack trace and its
    `BACKWARD_ANNOTATIONS`; a node whose forward op has no stack trace keeps its own (the
    `backward()` line), untagged."""
    forward, annotations = {}, {}
    for node in gm.graph.nodes:
        custom = node.meta.get("custom") or {}
        seq = custom.get(GRADIENT_OF)
        if seq is None:
            if "seq_nr" in node.meta:
                # The op that created autograd node `seq` comes first; ops after it that
                # create none carry the same number.
                forward.setdefault(node.meta["seq_nr"], node.meta.get("stack_trace"))
                annotations.setdefault(node.meta["seq_nr"], custom.get(BACKWARD_ANNOTATIONS))
            continue
        if annotations.get(seq):
            node.meta["custom"] = {**custom, **annotations[seq]}
        if forward.get(seq):
            node.meta["stack_trace"] = forward[seq]
        else:
            del node.meta["custom"][GRADIENT_OF]


@dataclass
class CaptureStats:
    """Time this process spent capturing: `tracing_seconds` running functions on fake
    tensors under autograd, functionalised and decomposed to core ATen; `captures` counts
    them."""
    captures: int = 0
    tracing_seconds: float = 0.0


capture_stats = CaptureStats()


def capture(fn: Callable[..., Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor],
            requires_grad: Sequence[bool] | None = None, *,
            value_read_hint: str = "Read values after the step instead.",
            check_lowerings: bool = True, tensor_hook=None, user_fn: Callable | None = None,
            library: Sequence[str] = (),
            extra_decompositions: dict | None = None,
            graph_pass: Callable[[fx.GraphModule], None] | None = None) -> fx.GraphModule:
    """Trace ``fn(*inputs) -> sequence of tensors`` into a functional core-ATen graph.

    `inputs` give shapes and dtypes only; `fn` runs on fake tensors (functional tensors over
    fake ones) and never sees their data. Inputs flagged in `requires_grad` are autograd
    leaves, so `fn` may call `backward()` on a loss computed from them and read their
    `.grad`. In-place updates of inputs are visible only through what `fn` returns: return
    every tensor whose new value matters. `torch.compiler.is_compiling()` is true while
    `fn` runs, so library code takes its compile-friendly paths. Reading a tensor's value
    inside `fn` raises `TensorValueReadError` with `value_read_hint` appended. With
    `check_lowerings`, an op that has no JAX lowering raises `LoweringError` here, naming
    the op, its overload and the user's source line.
    `tensor_hook(t)` sees every real tensor an op inside `fn` receives (one `fn` closed
    over rather than took as an input) and returns the tensor the op uses in its place;
    a real tensor it lets through becomes a constant of the graph. In-place ops on
    constants and on tensors made in `fn` are captured like any other op; an in-place
    write into a real tensor `fn` closed over is refused (`CaptureError`), since the
    program could only write into its own copy.

    Errors name the line of `user_fn` (default `fn`; a caller that wraps the user's
    function passes the user's) or of the code it calls, skipping frames of the standard
    library, of installed packages, of bridge and of the folders in `library`.
    `extra_decompositions` ({op overload: function}) are used in place of the table's own
    rules and of the ops' lowerings (`cstorch.register_decomposition`). `graph_pass`
    rewrites the traced graph in place before it is cleaned up and checked
    (`bridge.traced_once`).
    """
    requires_grad = list(requires_grad or [False] * len(inputs))
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    # From shape and dtype only: a lazily created tensor stays unmaterialised.
    fakes = [fake(fake_mode, tuple(t.shape), make_contiguous_strides_for(tuple(t.shape)), t.dtype)
             for t in inputs]

    def functional_fn(*args):
        with _Functionalise():
            # Wrapping asks each input's metadata through the torch function modes, which
            # have nothing to do for the capture's own inputs.
            with torch._C.DisableTorchFunction():
                wrapped = [FunctionalTensor.to_functional(a) for a in args]
            # Leaves of the functional tensors, so that backward() fills their `.grad`.
            for w, g in zip(wrapped, requires_grad):
                if g:
                    w.requires_grad_(True)
            outs = list(fn(*wrapped))
        return [_unwrap(o) for o in outs]

    code = anchor_stack_traces(user_fn if user_fn is not None else fn)
    token = user_code.set((frozenset([code] if code else []),
                            tuple(os.path.join(os.path.abspath(d), "") for d in library)))
    capture_stats.captures += 1
    start = time.perf_counter()
    try:
        # Node meta kept while tracing gives forward ops their autograd `seq_nr`, which
        # `_gradients_marked` ties the backward ops to. Library code that skips its
        # value-dependent checks under torch.compile (transformers' masks) skips them here.
        with fake_mode, _CaptureMode(value_read_hint, tensor_hook), \
                fx_traceback.preserve_node_meta(), torch.enable_grad(), _compiling(), \
                _fake_tensor_log_quiet(), _lean_node_meta():
            fx_traceback.get_current_meta()["stack_trace"] = NO_USER_FRAME
            # A lazy graph module generates its Python code only when the code is read or
            # called (the graph's artifact, a recapture's comparison); lowering reads the
            # nodes. make_fx and the clean-up below would each generate it.
            with _use_lazy_graph_module(True):
                table = decompositions()
                if extra_decompositions:
                    table = {**table, **extra_decompositions}
                graph = make_fx(functional_fn, decomposition_table=table,
                                record_stack_traces=True)(*fakes)
        for node in graph.graph.nodes:
            if node.meta.get("stack_trace") == NO_USER_FRAME:
                del node.meta["stack_trace"]
        _point_gradients_at_forward(graph)
        if graph_pass is not None:
            graph_pass(graph)
        _drop_profiler_ops(graph)
        graph.graph.eliminate_dead_code()
        graph.recompile()
    finally:
        user_code.reset(token)
        capture_stats.tracing_seconds += time.perf_counter() - start
    if check_lowerings:
        check_lowerable(graph)
    return graph


def _unwrap(t):
    """The value a functional tensor holds after every update made to it."""
    if not isinstance(t, FunctionalTensor):
        return t
    torch._sync(t)
    return torch._from_functional_tensor(t.elem)


# Fake tensors log every failing meta kernel with its traceback; the capture raises the
# error itself, named after the user's line.
_FAKE_TENSOR_LOG = logging.getLogger("torch._subclasses.fake_tensor")


@contextlib.contextmanager
def _fake_tensor_log_quiet():
    before = _FAKE_TENSOR_LOG.disabled
    _FAKE_TENSOR_LOG.disabled = True
    try:
        yield
    finally:
        _FAKE_TENSOR_LOG.disabled = before


@contextlib.contextmanager
def _lean_node_meta():
    """Leaves out two things make_fx makes for every traced tensor (each input and op
    result) that nothing here needs. It records, as the node's `val`, a detached copy of
    the fake tensor, so that a later in-place op cannot change it; under functionalisation
    no op writes into the fake tensors the tracer sees, so the fake tensor itself is kept.
    And it derives a `tensor_meta` summary, which only graph passes this project does not
    run read (FX's own printing reads `val`)."""
    snapshot_fake, tensor_meta = proxy_tensor.snapshot_fake, proxy_tensor._extract_tensor_metadata

    def snapshot(val, include_real=False):
        if type(val) is FakeTensor:
            with torch._C.DisableTorchFunction():   # one read per traced tensor
                if not val.requires_grad and getattr(val, "real_tensor", None) is None:
                    return val
        return snapshot_fake(val, include_real)

    proxy_tensor.snapshot_fake = snapshot
    proxy_tensor._extract_tensor_metadata = lambda val: None
    try:
        yield
    finally:
        proxy_tensor.snapshot_fake, proxy_tensor._extract_tensor_metadata = snapshot_fake, tensor_meta


@contextlib.contextmanager
def _compiling():
    """`torch.compiler.is_compiling()` is true inside, as torch.export sets it while it
    traces Python code."""
    before = torch.compiler._is_compiling_flag
    torch.compiler._is_compiling_flag = True
    try:
        yield
    finally:
        torch.compiler._is_compiling_flag = before


def _drop_profiler_ops(gm: fx.GraphModule):
    """`record_function` markers (torch.optim wraps every `step` in one) carry no data."""
    for node in reversed(list(gm.graph.nodes)):
        if node.op == "call_function" and getattr(node.target, "namespace", None) == "profiler":
            gm.graph.erase_node(node)
