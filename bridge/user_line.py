"""Which line of the user's code a capture error is about: the stack traces recorded on
the captured graph's nodes, and the user's frames named in the messages of errors raised
while a step is captured."""
import contextvars
import os
import sys
import sysconfig
import traceback

import torch


try:
    from torch.fx.proxy import _STACK_TRACE_ANCHORS
except ImportError:  # a torch without anchors: make_fx keeps `forward` frames only
    _STACK_TRACE_ANCHORS = frozenset()


def stack_trace() -> str:
    """The stack trace make_fx would record for the nodes of the torch call being handled,
    from one walk over the frames, where make_fx would extract and symbolise the whole
    stack again for every node it creates. The frames kept are those make_fx keeps:
    `forward` methods, `torch/__init__.py` and registered anchors (the step function), less
    frames of torch's tracing machinery (`machinery`). Every node the call creates (a
    composite op's parts, a backward's ops) then carries the call's trace, as
    `preserve_node_meta` hands `stack_trace` to new nodes."""
    anchors = _STACK_TRACE_ANCHORS
    kept = []
    frame = sys._getframe(2)
    while frame is not None:
        code = frame.f_code
        if (code.co_name == "forward" or code.co_filename.endswith(_TORCH_INIT)
                or (code.co_filename, code.co_name) in anchors):
            kept.append((code.co_filename, frame.f_lineno, code.co_name))
        frame = frame.f_back
    key = tuple(f for f in reversed(kept) if not machinery(f[0]))
    text = _formatted_traces.get(key)
    if text is None:
        summary = traceback.StackSummary.from_list([traceback.FrameSummary(*f) for f in key])
        text = _formatted_traces[key] = "".join(summary.format()).strip()
    return text


_TORCH_INIT = os.path.join("torch", "__init__.py")


_TORCH = os.path.dirname(torch.__file__)


_MACHINERY_DIRS = tuple(os.path.join(_TORCH, d, "") for d in (
    "_dynamo", "_higher_order_ops", "_inductor", "_library", "_logging", "_subclasses",
    "export", "fx"))


_MACHINERY_FILES = frozenset({os.path.join(_TORCH, "__init__.py"),
                              os.path.join(_TORCH, "_compile.py"), "<string>"})


def machinery(filename: str) -> bool:
    """Whether a frame of `filename` is torch's tracing machinery, never the user's code.
    make_fx asks torch's `uninteresting_files()`, whose list takes importing
    torch._inductor and torch.export to build, a cost on every process's first step;
    every file of that list lies in these folders or files."""
    return filename in _MACHINERY_FILES or filename.startswith(_MACHINERY_DIRS)


_formatted_traces: dict = {}


# The stack trace of a node no frame of the user's code made (a graph input, or an op of a
# step defined in `python -c` or `exec`'d code, whose frames are `<string>`). make_fx
# extracts and symbolises the whole stack itself for any node without a trace, to find
# the same nothing, at a cost that grows with the model. Removed afterwards.
NO_USER_FRAME = "<no user frame>"


# The capture in progress: the code objects of the user's function (its frames and those
# it calls are the user's; the frames above it are the capture's own) and the folders of
# library code, whose frames are never the user's line.
user_code = contextvars.ContextVar("bridge_user_code", default=None)


_BRIDGE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "")


_LIBRARY = tuple({os.path.join(sysconfig.get_paths()[k], "") for k in
                  ("stdlib", "platstdlib", "purelib", "platlib")} | {_BRIDGE_DIR, "<frozen "})


def user_source() -> str | None:
    """The user's frames at this point of the capture in progress, outermost first, as a
    traceback prints them; None outside a capture or when no frame of the user's code is
    on the stack."""
    if user_code.get() is None:
        return None
    codes, library = user_code.get()
    library = _LIBRARY + library
    frames = []
    frame = sys._getframe(1)
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    outer = max((i for i, f in enumerate(frames) if f.f_code in codes), default=None)
    if outer is None:
        # Not inside the user's function (a torch hook, say): its innermost own frame.
        frames = [next((f for f in frames if not f.f_code.co_filename.startswith(library)), None)]
    else:
        frames = frames[outer::-1]
    frames = [f for f in frames if f is not None and not f.f_code.co_filename.startswith(library)]
    if not frames:
        return None
    summary = traceback.StackSummary.extract((f, f.f_lineno) for f in frames)
    return "".join(summary.format()).rstrip()


def with_user_line(message: str) -> str:
    """`message` followed by the user's line it is about, when a capture is in progress,
    and by the line of an installed library's code (`torch.nn`'s, say) that the user's line
    led to, when that is where it happened."""
    source = user_source()
    if not source:
        return message
    inner = _library_line()
    return f"{message}\nIn the step, at:\n{source}" + (
        f"\nwhich led to this line of library code:\n{inner}" if inner else "")


# torch's own dispatch of a call (a `__torch_function__` mode, `Tensor` methods written
# in Python): never the line that did something.
_DISPATCH_FILES = frozenset(os.path.join(_TORCH, f) for f in (
    "overrides.py", "_tensor.py", "_ops.py", os.path.join("utils", "_python_dispatch.py"),
    os.path.join("utils", "_device.py"), "_compile.py"))


def _library_line() -> str | None:
    """Where the torch call being handled was made, as a traceback prints it, when that is
    an installed library's code (not torch's dispatch machinery, not this project's
    packages); None when the user's own code made it."""
    codes, library = user_code.get()
    own = (_BRIDGE_DIR,) + tuple(library)
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if not (name.startswith(own) or name in _DISPATCH_FILES or machinery(name)):
            break
        frame = frame.f_back
    if frame is None or frame.f_code in codes or not frame.f_code.co_filename.startswith(_LIBRARY):
        return None
    return "".join(traceback.StackSummary.extract([(frame, frame.f_lineno)]).format()).rstrip()


def anchor_stack_traces(fn):
    """Make the tracer keep `fn`'s frames in each node's stack trace.

    make_fx records only frames named `forward` (nn.Module code) unless a function is
    registered as an anchor; a step function is not a `forward`, and without its frames an
    error about an op could not point at the user's line. Returns `fn`'s code object.
    """
    target = getattr(fn, "__func__", fn)
    if not hasattr(target, "__code__"):
        target = getattr(type(fn), "__call__", None)  # noqa: B004 (the method itself)
    while hasattr(target, "__wrapped__") and not hasattr(target, "__code__"):
        target = target.__wrapped__
    if not hasattr(target, "__code__"):
        return None
    try:
        from torch.fx.proxy import _register_stack_trace_anchor  # noqa: PLC0415 (private; absent from some torch builds)
    except ImportError:  # a torch without anchors: traces keep `forward` frames only
        return target.__code__
    _register_stack_trace_anchor(target)
    return target.__code__
