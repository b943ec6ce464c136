"""The base of every metric: accumulators that live in the run's state on the device."""
import abc
import re

import torch


class Metric(torch.nn.Module, abc.ABC):
    """A running evaluation metric.

    A metric is a `torch.nn.Module` whose accumulators are buffers. Calling it
    (`metric(labels=..., predictions=...)`) folds one batch into the accumulators, in place;
    `compute()` (or `float(metric)`) turns them into the metric's value; `reset()` zeroes
    them. Call it inside a traced eval step (`@cstorch.trace` under `torch.no_grad()`) and
    the accumulators are state of the compiled program: they are updated on the device
    every step and copied to the host only when `compute()` reads them after the loop. A
    metric held by a compiled module is state of that module (`model.<path>.<buffer>`); a
    metric held by no compiled module joins the run's state the first time a traced step
    calls it, as `metrics.<name>.<buffer>`. Called outside a traced step, it updates the
    same accumulators eagerly, with the same results.

    The accumulators are non-persistent buffers: they are not part of the owning module's
    `state_dict()`, so checkpoints of a model hold its weights only, and loading a
    checkpoint leaves the metrics as they are.

    Subclasses declare their accumulators with `register_state` and implement `update`
    (fold in one batch, with in-place tensor ops on the accumulators only: assigning a new
    tensor to one would replace state rather than update it) and `compute` (the value from
    the accumulators, as torch ops).

    Args:
        name: the name the metric is logged and registered under.
    """

    def __init__(self, name: str):
        super().__init__()
        if not isinstance(name, str) or not name:
            raise TypeError(f"a metric needs a non-empty string name, got {name!r}")
        self.name = name
        self._state_names: list = []
        # A buffer rather than a Python counter: inside a traced step the Python body runs
        # once at capture, while the compiled program runs every step.
        self.register_state("update_count", (), torch.int64)

    def register_state(self, name: str, shape=(), dtype=torch.float32):
        """Declare an accumulator: a zero-filled buffer of `shape` and `dtype` that
        `reset()` zeroes again."""
        self.register_buffer(name, torch.zeros(shape, dtype=dtype), persistent=False)
        self._state_names.append(name)

    @abc.abstractmethod
    def update(self, *args, **kwargs):
        """Fold one batch into the accumulators."""

    def forward(self, *args, **kwargs):
        """Fold one batch into the accumulators (see `update` for the arguments)."""
        with torch.no_grad():
            self.update(*args, **kwargs)
            self.update_count.add_(1)

    @abc.abstractmethod
    def compute(self) -> torch.Tensor:
        """The metric's value over every batch since construction or the last `reset()`,
        as a float32 scalar tensor. Outside a traced step this reads the accumulators from
        the device (the only host transfer a metric makes)."""

    def reset(self):
        """Zero the accumulators (on the device, where they live there)."""
        with torch.no_grad():
            for name in self._state_names:
                getattr(self, name).zero_()

    @property
    def num_updates(self) -> int:
        """How many batches were folded in since construction or the last `reset()`."""
        return int(self.update_count)

    def __float__(self):
        return float(self.compute())

    def extra_repr(self):
        return f"name={self.name!r}"


def state_prefix(name: str) -> str:
    """The run-state prefix of a metric called `name`: its characters other than letters,
    digits and underscores (a logging name such as ``eval/accuracy``) become underscores,
    so state names stay valid checkpoint keys."""
    return "metrics." + re.sub(r"\W", "_", name)


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
