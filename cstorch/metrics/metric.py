"""The base of every metric: accumulators that live in the run's state on the device."""
import abc
import functools
import re
import weakref

import torch

from cstorch.run.capture_context import is_capturing

# Every metric constructed in this process, in order, for `get_all_metrics`; weak, so a
# metric nobody holds any more is not listed.
_REGISTRY: "list[weakref.ref]" = []


class Metric(torch.nn.Module, abc.ABC):
    """A running evaluation metric.

    A metric is a `torch.nn.Module` whose accumulators are buffers. Calling it
    (`metric(labels=..., predictions=...)`) folds one batch into the accumulators, in place,
    and returns the value so far; `compute()` (or `float(metric)`) turns them into the
    metric's value; `reset()` sets them back to their initial values. Call it inside a
    traced eval step (`@cstorch.trace` under `torch.no_grad()`) and the accumulators are
    state of the compiled program: they are updated on the device every step and copied to
    the host only when `compute()` reads them after the loop. A metric held by a compiled
    module is state of that module (`model.<path>.<buffer>`); a metric held by no compiled
    module joins the run's state the first time a traced step calls it, as
    `metrics.<name>.<buffer>`. Called outside a traced step, it updates the same
    accumulators eagerly, with the same results.

    The accumulators are non-persistent buffers unless registered otherwise: they are not
    part of the owning module's `state_dict()`, so checkpoints of a model hold its weights
    only, and loading a checkpoint leaves the metrics as they are.

    Subclasses declare their accumulators in `reset` with `register_state` (the
    constructor calls `reset()` once, so the first call creates them and later calls set
    them back to the values given), and implement `update` (fold in one batch, with
    in-place tensor ops on the accumulators only: assigning a new tensor to one would
    replace state rather than update it) and `compute` (the value from the accumulators).

    Args:
        name: the name the metric is logged and registered under; None is allowed (the
            metric is then listed by `get_all_metrics` as ``"None.<i>"``).
    """

    def __init__(self, name):
        super().__init__()
        if name is not None and not isinstance(name, str):
            raise TypeError(f"a metric's name is a string or None, got {name!r}")
        self.name = name
        self._state_names: list = []
        self._state_initial: dict = {}
        # A buffer rather than a Python counter: inside a traced step the Python body runs
        # once at capture, while the compiled program runs every step.
        self.register_buffer("update_count", torch.zeros((), dtype=torch.int64),
                             persistent=False)
        self.reset()
        _REGISTRY[:] = [ref for ref in _REGISTRY if ref() is not None]
        _REGISTRY.append(weakref.ref(self))

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # Every `reset` a subclass writes also restarts the update count, as the base's
        # own does, whether or not it calls up.
        own = cls.__dict__.get("reset")
        if own is not None and not getattr(own, "_counts_reset", False):
            @functools.wraps(own)
            def reset(self):
                with torch.no_grad():
                    own(self)
                    self.update_count.zero_()
            reset._counts_reset = True
            cls.reset = reset

    def register_state(self, name: str, tensor: torch.Tensor, persistent: bool = False):
        """Declare an accumulator `name` starting at `tensor` (a buffer, in the owner's
        `state_dict()` only when `persistent`). Called again for the same name (as `reset`
        does), it writes `tensor` into the existing accumulator in place, wherever that
        lives, so state on the device is set rather than replaced."""
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"register_state({name!r}, ...) needs a tensor, got "
                            f"{type(tensor).__name__}")
        tensor = tensor.detach()
        if name in self._state_initial:
            current = getattr(self, name)
            if tuple(current.shape) != tuple(tensor.shape):
                raise ValueError(f"state {name!r} of {type(self).__name__} has shape "
                                 f"{tuple(current.shape)}; it cannot be set to a tensor of "
                                 f"shape {tuple(tensor.shape)}")
            with torch.no_grad():
                current.copy_(tensor.to(current.dtype))
        else:
            self.register_buffer(name, tensor.clone(), persistent=persistent)
            self._state_names.append(name)
        self._state_initial[name] = tensor.clone()

    @abc.abstractmethod
    def update(self, *args, **kwargs):
        """Fold one batch into the accumulators."""

    def forward(self, *args, **kwargs):
        """Fold one batch into the accumulators (see `update` for the arguments) and
        return the value so far, as `compute()` gives it."""
        with torch.no_grad():
            self.update(*args, **kwargs)
            self.update_count.add_(1)
            return self.compute()

    @abc.abstractmethod
    def compute(self):
        """The metric's value over every batch since construction or the last `reset()`.
        Outside a traced step this reads the accumulators from the device (the only host
        transfer a metric makes); inside one it is a tensor of the step."""

    def reset(self):
        """Set every accumulator back to the value it was registered with (on the device,
        where it lives there) and the update count to 0."""
        with torch.no_grad():
            for name in self._state_names:
                self.register_state(name, self._state_initial[name])
            self.update_count.zero_()

    @property
    def num_updates(self) -> int:
        """How many batches were folded in since construction or the last `reset()`."""
        return int(self.update_count)

    def __float__(self):
        return float(self.compute())

    def extra_repr(self):
        return f"name={self.name!r}"


def get_all_metrics():
    """Yield ``(name, metric)`` for every metric constructed in this process and still
    alive, in the order of their names' first use. A name several metrics share is told
    apart by their order, as ``"<name>.0"``, ``"<name>.1"``, ...; a metric without a name
    counts as ``"None"``."""
    groups: dict = {}
    for ref in _REGISTRY:
        metric = ref()
        if metric is not None:
            groups.setdefault(str(metric.name), []).append(metric)
    for name, metrics in groups.items():
        if len(metrics) == 1:
            yield name, metrics[0]
        else:
            for i, metric in enumerate(metrics):
                yield f"{name}.{i}", metric


def in_traced_step() -> bool:
    """Whether a traced step is being captured now (values cannot be read then)."""
    return is_capturing()


def state_prefix(name) -> str:
    """The run-state prefix of a metric called `name`: its characters other than letters,
    digits and underscores (a logging name such as ``eval/accuracy``) become underscores,
    so state names stay valid checkpoint keys."""
    return "metrics." + re.sub(r"\W", "_", str(name))


def as_tensor(value, dtype=torch.float32) -> torch.Tensor:
    """`value` (a number or a tensor) as a tensor of `dtype`."""
    if isinstance(value, torch.Tensor):
        return value.to(dtype)
    return torch.tensor(value, dtype=dtype)


def weights_like(weights, reference: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """`weights` (None for all ones, a number, or a tensor that broadcasts to
    `reference`) as a tensor of `reference`'s shape."""
    if weights is None:
        return torch.ones(reference.shape, dtype=dtype)
    weights = as_tensor(weights, dtype)
    try:
        return torch.broadcast_to(weights, reference.shape)
    except RuntimeError:
        raise ValueError(f"weights of shape {tuple(weights.shape)} do not broadcast to the "
                         f"shape {tuple(reference.shape)} of the values they weigh; pass one "
                         "weight per value, or weights that broadcast to them") from None


def check_same_shape(labels: torch.Tensor, predictions: torch.Tensor, metric: str):
    if labels.shape != predictions.shape:
        raise ValueError(f"{metric}: labels have shape {tuple(labels.shape)} but predictions "
                         f"{tuple(predictions.shape)}; pass one prediction per label")


def safe_div(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """`num / den`, 0 where `den` is 0."""
    zero = den == 0
    return torch.where(zero, torch.zeros_like(num), num / torch.where(zero, torch.ones_like(den),
                                                                         den))
