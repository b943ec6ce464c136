"""`cerebras.pytorch.core.annotation`: attach compiler attributes to the ops of a function.

On a Cerebras system an annotation asks the compiler for something about a region of the
model (recompute this region, name this matmul, expect this sparsity of experts). Here
the attributes are recorded, and numerics are unchanged:

- on the graph: every op traced while an annotated function runs carries the forward
  attribute in its node's ``custom["cs.internal"]`` dict (``{name: value}``), and the ops
  computing their gradients carry the backward attribute (`cstorch.core.graph_meta`);
- on the function: the wrapper's ``__cs_annotations__`` lists its (forward, backward)
  attributes;
- while it runs: `current_annotations()` returns the attributes of every annotated
  function on the call stack, innermost last.

Usage, as Model Zoo writes its annotations::

    @dataclass
    class NamedConfig(AnnotationMode.Config):
        name: str

    def get_attribute(config, is_backward):
        return AnnotationMode.Attribute("named_matmul", f"{config.name}.{'bwd' if is_backward else 'fwd'}")

    def named_matmul(name, enable_fwd=True, enable_bwd=True):
        return create_annotation(NamedConfig, get_attribute, name=name,
                                 enable_fwd=enable_fwd, enable_bwd=enable_bwd)

    @named_matmul("qk")
    def scores(q, k):
        return q @ k.transpose(-1, -2)
"""
import abc
import collections
import contextlib
import contextvars
import dataclasses
import functools
from typing import Any
from collections.abc import Callable

import torch
from torch.utils.hooks import RemovableHandle

from cstorch.core.graph_meta import CS_INTERNAL, annotated
from cstorch.lib import cerebras_pytorch_lib
from cstorch.run.current import current_backend_impl

__all__ = ["AnnotationMode", "ReverseHooksExecutor", "SkipBwdAnnotation", "annotate",
           "cerebras_pytorch_lib", "create_annotation", "current_annotations",
           "current_backend_impl", "get_hooks_executor", "register_function_mode_forward_hook",
           "register_function_mode_forward_pre_hook"]

_active: contextvars.ContextVar[tuple["AnnotationMode.Attribute", ...]] = \
    contextvars.ContextVar("cstorch_annotations", default=())
# OrderedDicts: a RemovableHandle holds its dict by weak reference, which a dict refuses.
_forward_pre_hooks: dict[int, Callable] = collections.OrderedDict()
_forward_hooks: dict[int, Callable] = collections.OrderedDict()


class AnnotationMode(abc.ABC):
    """A scope whose ops carry the attribute of an annotation `config`.

    A subclass says what the attribute is (`get_attribute`); ``with mode: ...`` records
    it on the ops traced inside (when `config.enable_fwd`) and on the ops computing their
    gradients (when `config.enable_bwd`). `create_annotation` builds such a mode and the
    decorator users write.
    """

    @dataclasses.dataclass(frozen=True)
    class Attribute:
        """One compiler attribute: `name` and a value of plain Python data (numbers,
        strings, lists, dicts)."""
        name: str
        value: Any

    @dataclasses.dataclass
    class Config:
        """Base of an annotation's configuration (a dataclass). Subclasses add their
        own fields; these two say whether the forward ops and the gradient ops are
        annotated. They have no defaults, so a subclass may add required fields."""
        enable_fwd: bool
        enable_bwd: bool

    def __init__(self, config: "AnnotationMode.Config"):
        if not isinstance(config, AnnotationMode.Config):
            raise TypeError(f"AnnotationMode expects an AnnotationMode.Config, got "
                            f"{type(config).__name__}")
        self._config = config
        self._is_backward = False
        self._open: list[tuple[Any, contextlib.ExitStack]] = []

    @property
    def config(self) -> "AnnotationMode.Config":
        return self._config

    @abc.abstractmethod
    def get_attribute(self, config):
        """The `AnnotationMode.Attribute` of `config` (or None for none); while the
        backward attribute is asked for, `self.is_backward` is True."""

    @property
    def is_backward(self) -> bool:
        """Whether `get_attribute` is being asked for the gradient ops' attribute."""
        return self._is_backward

    def _attribute(self, is_backward: bool):
        self._is_backward = is_backward
        try:
            attr = self.get_attribute(self._config)
        finally:
            self._is_backward = False
        if attr is not None and not isinstance(attr, AnnotationMode.Attribute):
            raise TypeError(f"get_attribute must return an AnnotationMode.Attribute or None, "
                            f"got {type(attr).__name__}")
        return attr

    def enable_annotation(self, attr, is_backward, enable_fwd, enable_bwd):
        """Start recording `attr`: on the ops traced from now on when `enable_fwd` (and
        not `is_backward`), on the ops computing their gradients when `enable_bwd`. Ended
        by `disable_annotation(attr)`."""
        fwd = attr if enable_fwd and not is_backward else None
        bwd = attr if enable_bwd else None
        stack = contextlib.ExitStack()
        stack.enter_context(annotated(
            {CS_INTERNAL: {fwd.name: fwd.value}} if fwd is not None else None,
            {CS_INTERNAL: {bwd.name: bwd.value}} if bwd is not None else None))
        token = _active.set(_active.get() + tuple(a for a in (fwd, bwd) if a is not None))
        stack.callback(_active.reset, token)
        self._open.append((attr, stack))

    def disable_annotation(self, attr):
        """Stop recording `attr`, the last annotation enabled (annotations end in the
        reverse order they started)."""
        if not self._open or self._open[-1][0] is not attr:
            raise RuntimeError("disable_annotation ends the annotation enabled last; "
                               f"{attr!r} is not it")
        self._open.pop()[1].close()

    def enable_bwd_annotation(self, args=(), kwargs=None):
        """Mark the gradient ops of the tensors in `args` and `kwargs`. The ops computing
        gradients already carry the backward attribute of the scope they were traced in,
        so this only collects their `grad_fn`s (`hook_tensor_grad_fn`); it returns
        `(args, kwargs)` unchanged."""
        grad_fns: list = []
        for leaf in torch.utils._pytree.tree_leaves((args, kwargs or {})):
            self.hook_tensor_grad_fn(leaf, grad_fns)
        return args, kwargs

    def hook_tensor_grad_fn(self, arg, grad_fns):
        """Append `arg`'s `grad_fn` (for a tensor that has one) to `grad_fns`; return
        `arg`."""
        if isinstance(arg, torch.Tensor) and arg.grad_fn is not None:
            grad_fns.append(arg.grad_fn)
        return arg

    def __enter__(self):
        fwd = self._attribute(False) if self._config.enable_fwd else None
        bwd = self._attribute(True) if self._config.enable_bwd else None
        if fwd is not None or bwd is not None:
            stack = contextlib.ExitStack()
            stack.enter_context(annotated(
                {CS_INTERNAL: {fwd.name: fwd.value}} if fwd is not None else None,
                {CS_INTERNAL: {bwd.name: bwd.value}} if bwd is not None else None))
            token = _active.set(_active.get() + tuple(a for a in (fwd, bwd) if a))
            stack.callback(_active.reset, token)
        else:
            stack = contextlib.ExitStack()
        self._open.append((self, stack))
        return self

    def __exit__(self, *exc):
        self._open.pop()[1].close()
        return False

    def __repr__(self):
        return f"{type(self).__name__}({self._config!r})"


class _FunctionAnnotation(AnnotationMode):
    """The mode `create_annotation` builds: the attribute comes from a function of the
    config and `is_backward`."""

    def __init__(self, config, get_attribute_fn):
        super().__init__(config)
        self._get_attribute_fn = get_attribute_fn

    def get_attribute(self, config):
        return self._get_attribute_fn(config, self.is_backward)


class SkipBwdAnnotation:
    """A stand-in for an annotation mode that annotates nothing: enabling and disabling
    do nothing."""

    def __init__(self, *args, **kwargs):
        pass

    def enable_annotation(self, *args, **kwargs):
        """Nothing to enable."""

    def disable_annotation(self, *args, **kwargs):
        """Nothing to disable."""


class ReverseHooksExecutor:
    """Hooks run in the reverse order they were registered (as gradients flow back
    through the ops that registered them)."""

    def __init__(self):
        self._hooks: list[Callable] = []

    def register_hook(self, hook):
        """Add `hook`; returns a handle whose `remove()` takes it out."""
        if not callable(hook):
            raise TypeError(f"a hook must be callable, got {type(hook).__name__}")
        self._hooks.append(hook)

        class _Handle:
            def remove(_):
                if hook in self._hooks:
                    self._hooks.remove(hook)
        return _Handle()

    def __call__(self, *args, **kwargs):
        for hook in reversed(list(self._hooks)):
            hook(*args, **kwargs)


def get_hooks_executor(arg) -> ReverseHooksExecutor:
    """The `ReverseHooksExecutor` of `arg` (a tensor or a `grad_fn`), made on first use."""
    executor = getattr(arg, "_cs_hooks_executor", None)
    if executor is None:
        executor = ReverseHooksExecutor()
        try:
            arg._cs_hooks_executor = executor
        except AttributeError:
            raise TypeError(f"cannot attach hooks to a {type(arg).__name__}") from None
    return executor


def register_function_mode_forward_pre_hook(hook) -> RemovableHandle:
    """Call `hook(fn, args, kwargs)` before every annotated function runs (the functions
    decorated by `create_annotation` or `annotate`). Returns a handle to remove it."""
    handle = RemovableHandle(_forward_pre_hooks)
    _forward_pre_hooks[handle.id] = hook
    return handle


def register_function_mode_forward_hook(hook) -> RemovableHandle:
    """Call `hook(fn, args, kwargs, output)` after every annotated function runs.
    Returns a handle to remove it."""
    handle = RemovableHandle(_forward_hooks)
    _forward_hooks[handle.id] = hook
    return handle


def current_annotations() -> list["AnnotationMode.Attribute"]:
    """The attributes of the annotated functions running now, outermost first."""
    return list(_active.get())


def annotate(annotation_mode: AnnotationMode) -> Callable[[Callable], Callable]:
    """A decorator that runs a function inside `annotation_mode`."""
    if not isinstance(annotation_mode, AnnotationMode):
        raise TypeError(f"annotate expects an AnnotationMode, got "
                        f"{type(annotation_mode).__name__}")
    config = annotation_mode.config
    fwd = annotation_mode._attribute(False) if config.enable_fwd else None
    bwd = annotation_mode._attribute(True) if config.enable_bwd else None

    def decorate(fn: Callable) -> Callable:
        if not callable(fn):
            raise TypeError(f"an annotation decorates a callable, got {type(fn).__name__}")

        def annotated_fn(*args, **kw):
            for hook in list(_forward_pre_hooks.values()):
                hook(fn, args, kw)
            with annotation_mode:
                out = fn(*args, **kw)
            for hook in list(_forward_hooks.values()):
                hook(fn, args, kw, out)
            return out

        functools.update_wrapper(annotated_fn, fn, updated=())
        annotated_fn.__cs_annotations__ = list(getattr(fn, "__cs_annotations__", [])) + \
            [(fwd, bwd)]
        annotated_fn.__cs_annotation_config__ = config
        return annotated_fn

    return decorate


def create_annotation(annotation_config: type[AnnotationMode.Config],
                      get_attribute_fn: Callable[[AnnotationMode.Config, bool],
                                                 AnnotationMode.Attribute | None],
                      **kwargs) -> Callable[[Callable], Callable]:
    """A decorator that runs a function inside an `AnnotationMode`.

    `annotation_config(**kwargs)` builds the configuration (a subclass of
    `AnnotationMode.Config`, so it is validated when the decorator is made);
    `get_attribute_fn(config, is_backward)` gives the attribute for the forward ops
    (``is_backward=False``, when `config.enable_fwd`) and for the gradient ops
    (``is_backward=True``, when `config.enable_bwd`).
    """
    if not (isinstance(annotation_config, type)
            and issubclass(annotation_config, AnnotationMode.Config)):
        raise TypeError(f"create_annotation expects a subclass of AnnotationMode.Config, got "
                        f"{annotation_config!r}")
    return annotate(_FunctionAnnotation(annotation_config(**kwargs), get_attribute_fn))
