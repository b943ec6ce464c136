"""What code written for the real package (on torch 2.4 to 2.7) relies on in torch, where
the torch installed here (2.13 and later) changed it.

`torch.utils._pytree.TreeSpec` was a dataclass whose fields were its constructor's
arguments (`type`, `context`, `children_specs`), so `dataclasses.replace(spec, type=...,
children_specs=...)` rebuilt a spec; Model Zoo's trainer does that to turn tuples into
lists whenever it dumps its config (`trainer/validate.py`), which every `cszoo fit` does.
Newer torch keeps the constructor's arguments but names the dataclass fields `_context` and
`_children`, and `dataclasses.replace` passes the fields by name: the constructor refuses
them. `restore_treespec_replace` makes the constructor also take the field names, which
is all `dataclasses.replace` needs; the spec built is the same.
"""
import dataclasses
import functools
import inspect

from torch.utils import _pytree

_UNSET = object()


def _accepts_field_names(cls):
    params = inspect.signature(cls.__init__).parameters
    return all(f.name in params for f in dataclasses.fields(cls) if f.init)


def restore_treespec_replace():
    """Let `dataclasses.replace` rebuild a `TreeSpec` again. Does nothing where the
    installed torch's constructor already takes every init field by its name."""
    cls = _pytree.TreeSpec
    if not dataclasses.is_dataclass(cls) or _accepts_field_names(cls):
        return
    init = cls.__init__
    if getattr(init, "_cstorch_field_names", False):
        return

    @functools.wraps(init)
    def __init__(self, type, context=_UNSET, children_specs=_UNSET, *, _context=_UNSET,
                 _children=_UNSET):
        # dataclasses.replace passes every field it was not told to change under the
        # field's own name: the constructor's argument, where given, is the change.
        context = _context if context is _UNSET else context
        children_specs = _children if children_specs is _UNSET else children_specs
        if context is _UNSET or children_specs is _UNSET:
            raise TypeError("TreeSpec() needs `context` and `children_specs` (or the "
                            "fields `_context` and `_children` that dataclasses.replace "
                            "passes)")
        init(self, type, context, children_specs)

    __init__._cstorch_field_names = True
    cls.__init__ = __init__
