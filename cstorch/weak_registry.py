"""`WeakRegistry`: what a backend was given (compiled modules, optimizers, metrics), held
weakly, so that a model the user drops frees its device arrays.

The backend needs every live model and optimizer (their tensors are the run's state) but
must not be what keeps them alive: the user's last reference going is the signal that the
state can go. Each object keeps the position it was registered at, dead or not, so the
names derived from positions (``model1``, ``optimizer2``) of the others never change.
"""
import weakref
from collections.abc import Callable


class WeakRegistry:
    """Registered objects, each at a fixed position, held by weak reference.

    Iterating gives the live objects in registration order; `items()` gives them with their
    positions; `[position]` the object at a position. `on_drop()` is called whenever a
    registered object is collected (from the garbage collector: it must only take note,
    or do what is safe at any point of the program)."""

    def __init__(self, on_drop: Callable[[], None] | None = None):
        self._refs: list = []
        self._on_drop = on_drop

    def append(self, obj) -> int:
        """Register `obj`; returns its position."""
        self._refs.append(weakref.ref(obj, self._dropped))
        return len(self._refs) - 1

    def _dropped(self, _ref):
        if self._on_drop is not None:
            self._on_drop()

    def items(self) -> list:
        """(position, object) of every live object, in registration order."""
        return [(i, obj) for i, r in enumerate(self._refs) if (obj := r()) is not None]

    def __iter__(self):
        return iter([obj for r in self._refs if (obj := r()) is not None])

    def __len__(self) -> int:
        return sum(1 for r in self._refs if r() is not None)

    def __contains__(self, obj) -> bool:
        return any(r() is obj for r in self._refs)

    def __getitem__(self, position: int):
        obj = self._refs[position]()
        if obj is None:
            raise LookupError(f"the object registered at position {position} no longer exists "
                              f"(the program that refers to it was captured before it was "
                              f"dropped)")
        return obj

    def __repr__(self):
        return f"WeakRegistry({list(self)!r})"
