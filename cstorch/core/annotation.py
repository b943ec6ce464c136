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
import contextlib
import contextvars
import dataclasses
import functools
from typing import Any, Callable, List, Optional, Tuple, Type

from cstorch.core.graph_meta import CS_INTERNAL, annotated

__all__ = ["AnnotationMode", "create_annotation", "current_annotations"]

_active: contextvars.ContextVar[Tuple["AnnotationMode.Attribute", ...]] = \
    contextvars.ContextVar("cstorch_annotations", default=())


class AnnotationMode:
    """A scope whose ops carry a forward and a backward attribute.

    ``with AnnotationMode(fwd, bwd): ...`` records `fwd` (an `AnnotationMode.Attribute`,
    or None) on the ops traced inside and `bwd` on the ops computing their gradients.
    `create_annotation` builds the decorators users write; this is the scope they open.
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

    def __init__(self, fwd: Optional["AnnotationMode.Attribute"] = None,
                 bwd: Optional["AnnotationMode.Attribute"] = None):
        for what, attr in (("forward", fwd), ("backward", bwd)):
            if attr is not None and not isinstance(attr, AnnotationMode.Attribute):
                raise TypeError(f"the {what} attribute must be an AnnotationMode.Attribute or "
                                f"None, got {type(attr).__name__}")
        self.fwd, self.bwd = fwd, bwd
        self._stack: Optional[contextlib.ExitStack] = None

    def __enter__(self):
        stack = contextlib.ExitStack()
        fwd = {CS_INTERNAL: {self.fwd.name: self.fwd.value}} if self.fwd is not None else None
        bwd = {CS_INTERNAL: {self.bwd.name: self.bwd.value}} if self.bwd is not None else None
        stack.enter_context(annotated(fwd, bwd))
        token = _active.set(_active.get() + tuple(a for a in (self.fwd, self.bwd) if a))
        stack.callback(_active.reset, token)
        self._stack = stack
        return self

    def __exit__(self, *exc):
        stack, self._stack = self._stack, None
        stack.close()
        return False

    def __repr__(self):
        return f"AnnotationMode(fwd={self.fwd!r}, bwd={self.bwd!r})"


def current_annotations() -> List["AnnotationMode.Attribute"]:
    """The attributes of the annotated functions running now, outermost first."""
    return list(_active.get())


def create_annotation(config_class: Type[AnnotationMode.Config],
                      get_attribute: Callable[[AnnotationMode.Config, bool],
                                              Optional[AnnotationMode.Attribute]],
                      **kwargs) -> Callable[[Callable], Callable]:
    """A decorator that runs a function inside an `AnnotationMode`.

    `config_class(**kwargs)` builds the configuration (a subclass of
    `AnnotationMode.Config`, so it is validated when the decorator is made);
    `get_attribute(config, is_backward)` gives the attribute for the forward ops
    (``is_backward=False``, when `config.enable_fwd`) and for the gradient ops
    (``is_backward=True``, when `config.enable_bwd`).
    """
    if not (isinstance(config_class, type) and issubclass(config_class, AnnotationMode.Config)):
        raise TypeError(f"create_annotation expects a subclass of AnnotationMode.Config, got "
                        f"{config_class!r}")
    config = config_class(**kwargs)
    fwd = get_attribute(config, False) if config.enable_fwd else None
    bwd = get_attribute(config, True) if config.enable_bwd else None

    def decorate(fn: Callable) -> Callable:
        if not callable(fn):
            raise TypeError(f"an annotation decorates a callable, got {type(fn).__name__}")

        def annotated_fn(*args, **kw):
            with AnnotationMode(fwd, bwd):
                return fn(*args, **kw)

        functools.update_wrapper(annotated_fn, fn, updated=())
        annotated_fn.__cs_annotations__ = list(getattr(fn, "__cs_annotations__", [])) + \
            [(fwd, bwd)]
        annotated_fn.__cs_annotation_config__ = config
        return annotated_fn

    return decorate
