"""Scopes a model opens around parts of its code: `name_scope` and `pol`."""
import contextlib
import contextvars
import functools

import wafer
from bridge.precision import MatmulPolicy
from cstorch.core.graph_meta import MATMUL_POLICY, NAME_SCOPE, annotated
from cstorch.run import current

__all__ = ["name_scope", "current_name_scope", "set_debug_scope", "pol", "current_pol"]

_names: contextvars.ContextVar[tuple] = contextvars.ContextVar("cstorch_name_scope", default=())
# The run's debug scope (`set_debug_scope`): the outermost level of every name scope.
_debug_scope = [None]
_levels: contextvars.ContextVar[tuple | None] = contextvars.ContextVar(
    "cstorch_pol", default=None)


def _clean(name: str) -> str:
    # '/' separates JAX scope levels; one name is one level.
    return name.replace("/", "|")


class name_scope:
    """``with cstorch.name_scope("grad_norm"): ...`` names the ops traced inside.

    Each op of a lowered step runs under a `jax.named_scope` of its ATen op and model line
    (``aten.addmm.default model.py:12``); inside a name scope that scope nests in the
    name, so the jaxpr, the StableHLO and optimised HLO op names, and profiles read
    ``grad_norm/aten.pow.Tensor_Scalar train.py:40``. Scopes nest (``outer/inner``). The
    ops computing gradients of ops in the scope are not renamed. Numerics are unchanged,
    and outside a traced step the scope only records its name (`current_name_scope()`).

    Besides the ``with`` form, an instance may be entered and left by hand
    (``scope.__enter__()`` ... ``scope.__exit__(None, None, None)``), as long as scopes
    are left in the reverse order they were entered.
    """

    def __init__(self, name: str, raw: bool = False):
        if not isinstance(name, str) or not name:
            raise ValueError(f"name_scope expects a non-empty string, got {name!r}")
        self.name = name
        self.raw = raw
        self._stack = []

    def __enter__(self):
        names = _names.get() + (self.name if self.raw else _clean(self.name),)
        stack = contextlib.ExitStack()
        token = _names.set(names)
        stack.callback(_names.reset, token)
        stack.enter_context(annotated({NAME_SCOPE: "/".join(_with_debug_scope(names))}))
        self._stack.append(stack)
        return self

    def __exit__(self, *exc):
        self._stack.pop().close()
        return False

    def __repr__(self):
        return f"name_scope({self.name!r})"


def _with_debug_scope(names: tuple) -> tuple:
    debug = _debug_scope[0]
    return ((debug,) + names) if debug else names


def set_debug_scope(name: str | None) -> None:
    """Make `name` the outermost level of the name scopes opened from now on (None or ""
    ends it)."""
    if name is not None and not isinstance(name, str):
        raise TypeError(f"set_debug_scope expects a str or None, got {type(name).__name__}")
    _debug_scope[0] = name or None


def current_name_scope() -> str:
    """The name scopes open now, under the debug scope, joined with '/' ('' outside
    any)."""
    return "/".join(_with_debug_scope(_names.get()))


def _check_level(what: str, level):
    if level is None:
        return
    if not isinstance(level, int) or isinstance(level, bool) or not 0 <= level < 3:
        raise ValueError(f"pol: {what} must be None or an integer in range [0, 3), got {level!r}")


def _backend_level() -> int:
    backend = current.backend()
    level = backend.precision_level if backend is not None else None
    return 0 if level is None else level


def _policy(level: int):
    """The `bridge.precision.MatmulPolicy` of a level (None: exact float32)."""
    if not level:
        return None
    return MatmulPolicy(**wafer.matmul_dtypes(level))


def current_pol() -> int:
    """The precision optimization level (POL) in effect for code running now.

    Inside a `pol` scope, the innermost scope's forward level; outside any, the backend's:
    `cstorch.backends.csx.precision.optimization_level` on a CSX backend, 0 on CPU and GPU
    backends (which compute in float32, as level 0 does) or without a backend. Code that
    runs in the backward pass (an autograd Function's `backward`) sees the level of the
    scope `backward()` is called in.
    """
    levels = _levels.get()
    return levels[0] if levels is not None else _backend_level()


class pol:
    """A precision optimization level (POL) for part of a model.

    ``cstorch.pol(level=2, bwd_level=0)`` is a context manager and a decorator: the ops
    traced inside compute their matmuls and convolutions at `level`, and the ops
    computing their gradients at `bwd_level` (see `wafer.precision` for what each level
    rounds). None keeps the level in effect around the scope. Model Zoo writes
    ``cstorch.pol(bwd_level=0)(self.lm_head)(hidden)`` to keep the output layer's
    backward pass in float32.

    Levels act where the backend computes at a precision level, a CSX backend; CPU and GPU
    backends compute in float32 whatever the scope says, though `current_pol()` inside
    reports the scope's level, which model code may branch on.

    Open the scope in model code or inside the traced step: the levels are part of the
    captured graph, and a step's compiled program is reused for later calls with the same
    arguments, so a scope opened around a call of the step applies to the call that
    captured it.
    """

    def __init__(self, level: int | None = None, bwd_level: int | None = None):
        _check_level("level", level)
        _check_level("bwd_level", bwd_level)
        self.level, self.bwd_level = level, bwd_level
        self._stack = []

    def __enter__(self):
        outer = _levels.get()
        base = outer if outer is not None else (_backend_level(),) * 2
        fwd = self.level if self.level is not None else base[0]
        bwd = self.bwd_level if self.bwd_level is not None else (
            self.level if self.level is not None else base[1])
        stack = contextlib.ExitStack()
        token = _levels.set((fwd, bwd))
        stack.callback(_levels.reset, token)
        if _applies():
            stack.enter_context(annotated({MATMUL_POLICY: _policy(fwd)},
                                          {MATMUL_POLICY: _policy(bwd)}))
        self._stack.append(stack)
        return self

    def __exit__(self, *exc):
        self._stack.pop().close()
        return False

    def __call__(self, fn):
        """Wrap `fn` (a function or a module) so that each call runs inside this scope."""
        if not callable(fn):
            raise TypeError(f"pol(...) wraps a callable, got {type(fn).__name__}")

        def in_scope(*args, **kwargs):
            with pol(self.level, self.bwd_level):
                return fn(*args, **kwargs)

        return functools.update_wrapper(in_scope, fn, updated=())

    def __repr__(self):
        return f"pol(level={self.level!r}, bwd_level={self.bwd_level!r})"


def _applies() -> bool:
    backend = current.backend()
    return backend is not None and backend.precision_level is not None
