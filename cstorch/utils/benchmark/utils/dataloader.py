"""Benchmarking of dataloaders: how fast an input function's batches arrive.

Conventions (the reference leaves them open; these are the choices made here):

* Epochs and steps are counted from 1, as the executor counts steps: the first batch of
  an epoch is ``epoch_step`` 1. ``global_step`` keeps counting across epochs.
* A step is sampled into `EpochMetrics.batch_metrics` when it is the first step of its
  epoch or when its ``epoch_step`` is a multiple of ``sampling_frequency``.
* Durations are ``numpy.timedelta64`` in nanoseconds measured with
  ``time.perf_counter_ns``; the ``*_time_ns`` stamps are wall-clock ``time.time_ns()``.
* The time between epochs (iterator creation included) counts towards the global rates:
  they measure what a training loop consuming every epoch would see.
"""
import logging
import operator
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable, Iterable

import numpy as np
import torch

log = logging.getLogger("cstorch")

_DEFAULT_SAMPLING_FREQUENCY = 100


def _ns(value: int) -> np.timedelta64:
    return np.timedelta64(int(value), "ns")


def _zero_time() -> np.timedelta64:
    return _ns(0)


def _rate(count: int, elapsed_ns: int) -> float:
    if elapsed_ns <= 0:
        # A clock too coarse to separate two events: no time passed as far as we can tell.
        return 0.0 if count == 0 else float("inf")
    return count * 1e9 / elapsed_ns


def _is_namedtuple(obj) -> bool:
    return isinstance(obj, tuple) and hasattr(type(obj), "_fields")


@dataclass(frozen=True)
class BatchSpec:
    """The structure of one batch: its containers and each tensor's shape and dtype.

    A batch spec is a tree of `BatchSpec` nodes. Two batches have equal (and equally
    hashing) specs exactly when they nest the same container types with the same keys in
    the same order and hold tensors of the same shapes and dtypes at the same places, so
    specs can key a dict of occurrences. Values never enter a spec: two batches of random
    numbers, or of different strings, share one.

    Attributes:
        kind: The node's type. ``torch.Tensor`` for any torch tensor; the container type
            (``dict``, ``OrderedDict``, ``list``, ``tuple``, a NamedTuple class, ...) for
            containers; the array type for other objects with ``shape`` and ``dtype``
            (e.g. ``numpy.ndarray``); the plain type for any other leaf (``int``, ``str``).
        keys: The keys of a mapping or the field names of a NamedTuple, in order; empty
            for any other node.
        children: The specs of a container's elements, in order; empty for leaves.
        shape: The shape of a tensor or array leaf, else None.
        dtype: The dtype of a tensor or array leaf, else None.
    """

    kind: type
    keys: tuple[Any, ...] = ()
    children: tuple["BatchSpec", ...] = ()
    shape: tuple[int, ...] | None = None
    dtype: Any = None

    @classmethod
    def from_batch(cls, batch: Any) -> "BatchSpec":
        """Describes ``batch``, recursing through mappings, lists and tuples."""
        if isinstance(batch, torch.Tensor):
            return cls(torch.Tensor, shape=tuple(batch.shape), dtype=batch.dtype)
        if isinstance(batch, Mapping):
            return cls(type(batch), keys=tuple(batch.keys()),
                       children=tuple(cls.from_batch(v) for v in batch.values()))
        if _is_namedtuple(batch):
            return cls(type(batch), keys=tuple(type(batch)._fields),
                       children=tuple(cls.from_batch(v) for v in batch))
        if isinstance(batch, (list, tuple)):
            return cls(type(batch), children=tuple(cls.from_batch(v) for v in batch))
        if hasattr(batch, "shape") and hasattr(batch, "dtype"):
            dtype = batch.dtype
            try:
                hash(dtype)
            except TypeError:
                dtype = str(dtype)
            return cls(type(batch), shape=tuple(int(d) for d in batch.shape), dtype=dtype)
        return cls(type(batch))

    @property
    def is_array(self) -> bool:
        """Whether this node is a tensor or array leaf."""
        return self.shape is not None

    def arrays(self) -> list["BatchSpec"]:
        """The tensor and array leaves under this node, depth first."""
        if self.is_array:
            return [self]
        return [leaf for child in self.children for leaf in child.arrays()]

    @property
    def batch_size(self) -> int | None:
        """The leading dimension shared by every tensor of the batch.

        None when the batch holds no tensors, holds a 0-d tensor, or its tensors disagree
        on the leading dimension (then the number of samples in a batch is ambiguous).
        """
        sizes = {leaf.shape[0] if leaf.shape else None for leaf in self.arrays()}
        if len(sizes) != 1:
            return None
        return sizes.pop()

    def __str__(self) -> str:
        if self.is_array:
            name = "Tensor" if self.kind is torch.Tensor else self.kind.__name__
            return f"{name}(shape={list(self.shape)}, dtype={self.dtype})"
        children = [str(c) for c in self.children]
        if issubclass(self.kind, Mapping):
            body = "{" + ", ".join(f"{k!r}: {c}" for k, c in zip(self.keys, children)) + "}"
            return body if self.kind is dict else f"{self.kind.__name__}({body})"
        if issubclass(self.kind, tuple) and self.keys:
            return (f"{self.kind.__name__}("
                    + ", ".join(f"{k}={c}" for k, c in zip(self.keys, children)) + ")")
        if self.kind is list:
            return "[" + ", ".join(children) + "]"
        if self.kind is tuple:
            return "(" + ", ".join(children) + ("," if len(children) == 1 else "") + ")"
        if issubclass(self.kind, (list, tuple)):
            return f"{self.kind.__name__}([" + ", ".join(children) + "])"
        return self.kind.__name__


@dataclass
class BatchSpecOccurence:
    """How often one `BatchSpec` occurred, and where it was first seen.

    Attributes:
        epoch: The epoch (counted from 1) of the first batch with this spec.
        epoch_step: That batch's step within its epoch (counted from 1).
        global_step: That batch's step counted across all epochs (from 1).
        count: How many batches of the whole benchmark had this spec.
    """

    epoch: int
    epoch_step: int
    global_step: int
    count: int = 1


@dataclass
class BatchMetrics:
    """Metrics of one sampled batch.

    Attributes:
        epoch_step: The step within its epoch at which the batch arrived (from 1).
        global_step: The step across all epochs at which the batch arrived (from 1).
        local_rate: Instantaneous rate in steps/second: the inverse of the time since the
            previous batch (since the epoch's iterator was created, for a first step).
        global_rate: Steps/second from the start of the first epoch up to this batch.
        profile_activities: The value of each requested profile activity at this batch.
        sampling_time_ns: Wall-clock time (``time.time_ns()``) at which it was sampled.
    """

    epoch_step: int
    global_step: int
    local_rate: float
    global_rate: float
    profile_activities: dict[str, Any] = field(default_factory=dict)
    sampling_time_ns: int = field(default_factory=time.time_ns)


@dataclass
class EpochMetrics:
    """Metrics of one epoch.

    Attributes:
        iterator_creation: Time taken by ``iter(dataloader)``.
        iteration_time: Time taken to draw the epoch's batches, iterator creation excluded.
        total_steps: Number of batches drawn in the epoch.
        batch_metrics: The sampled batches of the epoch.
        start_time_ns: Wall-clock time at which the epoch started.
        end_time_ns: Wall-clock time at which the epoch ended (0 while it runs).
    """

    iterator_creation: np.timedelta64 = field(default_factory=_zero_time)
    iteration_time: np.timedelta64 = field(default_factory=_zero_time)
    total_steps: int = 0
    batch_metrics: list[BatchMetrics] = field(default_factory=list)
    start_time_ns: int = field(default_factory=time.time_ns)
    end_time_ns: int = 0

    @property
    def total_time(self) -> np.timedelta64:
        """Time to create the epoch's iterator and iterate it."""
        return self.iterator_creation + self.iteration_time


@dataclass
class Metrics:
    """Metrics of one dataloader benchmark.

    Attributes:
        dataloader_build_time: Time taken by ``input_fn()`` to build the dataloader.
        epoch_metrics: Metrics of each epoch, in order.
        batch_specs: Each distinct batch structure seen, mapped to its occurrences.
        total_time: Time from the start of the first epoch to the end of the last one
            (dataloader building excluded; it is reported on its own).
        global_rate: Steps/second over ``total_time``.
        is_partial: True when the benchmark was interrupted before finishing (also the
            value of a `Metrics` that is still being filled in).
        start_time_ns: Wall-clock time at which the benchmark started.
        end_time_ns: Wall-clock time at which the benchmark ended (0 while it runs).
    """

    dataloader_build_time: np.timedelta64 = field(default_factory=_zero_time)
    epoch_metrics: list[EpochMetrics] = field(default_factory=list)
    batch_specs: dict[BatchSpec, BatchSpecOccurence] = field(default_factory=dict)
    total_time: np.timedelta64 = field(default_factory=_zero_time)
    global_rate: float = 0.0
    is_partial: bool = True
    start_time_ns: int = field(default_factory=time.time_ns)
    end_time_ns: int = 0

    @property
    def total_steps(self) -> int:
        """Number of steps across all epochs."""
        return sum(epoch.total_steps for epoch in self.epoch_metrics)

    @property
    def global_sample_rate(self) -> float | None:
        """Samples/second over ``total_time``.

        Only defined when every batch had the same structure, dtypes and shapes and its
        tensors share a leading (batch) dimension; None otherwise.
        """
        if len(self.batch_specs) != 1:
            return None
        batch_size = next(iter(self.batch_specs)).batch_size
        if batch_size is None:
            return None
        return self.global_rate * batch_size


# Profile activities: name -> (description, probe). A probe returns the value recorded at a
# sampled step; availability depends on the platform, so it is checked up front.

def _rss_probe() -> Callable[[], int] | None:
    try:
        import psutil  # noqa: PLC0415 (optional dependency)
    except ImportError:
        psutil = None
    if psutil is not None:
        process = psutil.Process()
        return lambda: int(process.memory_info().rss)
    if os.path.exists("/proc/self/statm"):
        page_size = os.sysconf("SC_PAGE_SIZE")

        def read_statm() -> int:
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * page_size

        return read_statm
    return None


def _peak_rss_probe() -> Callable[[], int] | None:
    try:
        import resource  # noqa: PLC0415 (POSIX only)
    except ImportError:
        return None
    # ru_maxrss is in bytes on macOS and in KiB on Linux and the BSDs.
    scale = 1 if sys.platform == "darwin" else 1024
    current = _rss_probe()

    def peak() -> int:
        value = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * scale
        # Linux refreshes its high-water mark lazily, so it can trail the current size.
        return value if current is None else max(value, current())

    return peak


_PROFILE_ACTIVITIES = {
    "memory": ("resident memory of this process, in bytes", _rss_probe),
    "peak_memory": ("peak resident memory of this process so far, in bytes", _peak_rss_probe),
}
_BYTE_ACTIVITIES = {"memory", "peak_memory"}


def _profile_probes(profile_activities) -> dict[str, Callable[[], Any]]:
    if profile_activities is None:
        return {}
    if isinstance(profile_activities, str) or not isinstance(profile_activities, Iterable):
        raise TypeError(
            f"benchmark_dataloader: profile_activities must be a list of activity names, "
            f"e.g. ['memory'], got {profile_activities!r}")
    supported = ", ".join(repr(n) for n in _PROFILE_ACTIVITIES)
    probes = {}
    for name in profile_activities:
        if name not in _PROFILE_ACTIVITIES:
            raise ValueError(f"benchmark_dataloader: unknown profile activity {name!r}; "
                             f"the supported activities are {supported}")
        if name in probes:
            continue
        description, make_probe = _PROFILE_ACTIVITIES[name]
        probe = make_probe()
        if probe is None:
            raise ValueError(f"benchmark_dataloader: profile activity {name!r} "
                             f"({description}) cannot be measured on {sys.platform}")
        probes[name] = probe
    return probes


def _check_count(name: str, value, default: int | None) -> int | None:
    if value is None:
        return default
    if isinstance(value, bool):
        raise TypeError(f"benchmark_dataloader: {name} must be a positive int or None, "
                        f"got the bool {value}")
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"benchmark_dataloader: {name} must be a positive int or None, got "
                        f"{type(value).__name__} {value!r}") from None
    if value < 1:
        raise ValueError(f"benchmark_dataloader: {name} must be a positive int or None, "
                         f"got {value}")
    return value


def benchmark_dataloader(
    input_fn: Callable[[], Iterable],
    num_epochs: int | None = None,
    steps_per_epoch: int | None = None,
    sampling_frequency: int | None = None,
    profile_activities: list[str] | None = None,
    print_metrics: bool = True,
) -> Metrics:
    """Measures how fast a dataloader produces batches.

    ``input_fn()`` is called once to build the dataloader, and each epoch iterates a fresh
    ``iter()`` of it. Every batch's structure is recorded in `Metrics.batch_specs`;
    timings and profile activities are recorded at sampled steps only, to keep the
    benchmark's own overhead out of the dataloader's way.

    Args:
        input_fn: A function without arguments that builds and returns the dataloader
            (any iterable; a ``torch.utils.data.DataLoader`` typically).
        num_epochs: Number of epochs to iterate. None means one epoch.
        steps_per_epoch: Most steps to take per epoch; an epoch also ends when the
            dataloader is exhausted. None means iterate each epoch to its end, so an
            infinite dataloader runs until interrupted.
        sampling_frequency: Sample every this many steps of an epoch (the first step of
            every epoch is always sampled). None means 100.
        profile_activities: Names of extra quantities to record at each sampled step:
            ``"memory"`` (resident memory of this process in bytes; DataLoader worker
            processes are not included) and ``"peak_memory"`` (peak resident memory of
            this process so far, in bytes). Probing adds overhead to sampled steps.
        print_metrics: Print a summary table of the metrics to stdout.

    Returns:
        The `Metrics` of the run. Interrupting the run with Ctrl-C (KeyboardInterrupt)
        stops it and returns the metrics gathered so far with ``is_partial=True``.

    Raises:
        TypeError: ``input_fn`` is not callable or returns something that cannot be
            iterated, or a count is not an int, or ``profile_activities`` is not a list.
        ValueError: a count is below 1, or a profile activity is unknown or not
            measurable on this platform.
    """
    if not callable(input_fn):
        raise TypeError(
            f"benchmark_dataloader: input_fn must be a function that builds and returns the "
            f"dataloader, got {type(input_fn).__name__}; pass `lambda: my_dataloader`")
    num_epochs = _check_count("num_epochs", num_epochs, 1)
    steps_per_epoch = _check_count("steps_per_epoch", steps_per_epoch, None)
    sampling_frequency = _check_count("sampling_frequency", sampling_frequency,
                                      _DEFAULT_SAMPLING_FREQUENCY)
    probes = _profile_probes(profile_activities)

    metrics = Metrics()
    epochs_start = None
    epoch = None            # the epoch in progress, for finishing it on interruption
    creation_start = iteration_start = None
    try:
        build_start = time.perf_counter_ns()
        try:
            dataloader = input_fn()
        finally:
            metrics.dataloader_build_time = _ns(time.perf_counter_ns() - build_start)
        if not (hasattr(dataloader, "__iter__") or hasattr(dataloader, "__getitem__")):
            raise TypeError(
                f"benchmark_dataloader: input_fn must return an iterable dataloader, it "
                f"returned {type(dataloader).__name__}")

        global_step = 0
        epochs_start = time.perf_counter_ns()
        for epoch_number in range(1, num_epochs + 1):
            epoch = EpochMetrics()
            metrics.epoch_metrics.append(epoch)
            iteration_start = None
            creation_start = time.perf_counter_ns()
            iterator = iter(dataloader)
            iteration_start = time.perf_counter_ns()
            epoch.iterator_creation = _ns(iteration_start - creation_start)

            previous = iteration_start
            while steps_per_epoch is None or epoch.total_steps < steps_per_epoch:
                try:
                    batch = next(iterator)
                except StopIteration:
                    break
                now = time.perf_counter_ns()
                epoch.total_steps += 1
                global_step += 1

                spec = BatchSpec.from_batch(batch)
                occurrence = metrics.batch_specs.get(spec)
                if occurrence is None:
                    metrics.batch_specs[spec] = BatchSpecOccurence(
                        epoch=epoch_number, epoch_step=epoch.total_steps,
                        global_step=global_step)
                else:
                    occurrence.count += 1

                if epoch.total_steps == 1 or epoch.total_steps % sampling_frequency == 0:
                    epoch.batch_metrics.append(BatchMetrics(
                        epoch_step=epoch.total_steps,
                        global_step=global_step,
                        local_rate=_rate(1, now - previous),
                        global_rate=_rate(global_step, now - epochs_start),
                        profile_activities={name: probe() for name, probe in probes.items()},
                    ))
                previous = now

            epoch.iteration_time = _ns(time.perf_counter_ns() - iteration_start)
            epoch.end_time_ns = time.time_ns()
            epoch = None
            # Shut a DataLoader's workers down before the next epoch starts its own.
            del iterator
        metrics.is_partial = False
    except KeyboardInterrupt:
        interrupted_at = time.perf_counter_ns()
        if epoch is not None:
            if iteration_start is None:
                epoch.iterator_creation = _ns(interrupted_at - creation_start)
            else:
                epoch.iteration_time = _ns(interrupted_at - iteration_start)
            epoch.end_time_ns = time.time_ns()
        log.warning("benchmark_dataloader was interrupted; returning the partial metrics "
                    "gathered so far")

    end = time.perf_counter_ns()
    metrics.end_time_ns = time.time_ns()
    if epochs_start is not None:
        metrics.total_time = _ns(end - epochs_start)
        metrics.global_rate = _rate(metrics.total_steps, end - epochs_start)

    if print_metrics:
        print(format_metrics(metrics, sorted(probes)))
    return metrics


# Printing.

def _format_duration(value: np.timedelta64) -> str:
    ns = int(value / np.timedelta64(1, "ns"))
    for unit, scale in (("s", 10**9), ("ms", 10**6), ("us", 10**3)):
        if abs(ns) >= scale:
            return f"{ns / scale:.3f} {unit}"
    return f"{ns} ns"


def _format_rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f}"


def _format_activity(name: str, value: Any) -> str:
    if name in _BYTE_ACTIVITIES and isinstance(value, int):
        return f"{value / 2**20:,.1f} MiB"
    return str(value)


def _table(headers: list[str], rows: list[list[str]], left: tuple[int, ...] = ()) -> str:
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]

    def line(cells):
        return "  ".join(c.ljust(w) if i in left else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule] + [line(r) for r in rows])


def format_metrics(metrics: Metrics, profile_activities: list[str] | None = None) -> str:
    """Renders ``metrics`` as the plain-text report `benchmark_dataloader` prints.

    ``profile_activities`` names the activity columns of the sampled-steps table; by
    default every activity found in the sampled batches.
    """
    if profile_activities is None:
        profile_activities = sorted({name for e in metrics.epoch_metrics
                                     for b in e.batch_metrics for name in b.profile_activities})
    status = "partial (interrupted)" if metrics.is_partial else "complete"
    sample_rate = metrics.global_sample_rate
    out = [
        f"Dataloader benchmark: {status}",
        f"  Dataloader build time: {_format_duration(metrics.dataloader_build_time)}",
        f"  Epochs: {len(metrics.epoch_metrics)}   Total steps: {metrics.total_steps}   "
        f"Total time: {_format_duration(metrics.total_time)}",
        f"  Global rate: {_format_rate(metrics.global_rate)} steps/s   Global sample rate: "
        + ("- (batches differ or have no batch dimension)" if sample_rate is None
           else f"{_format_rate(sample_rate)} samples/s"),
        "",
        "Epochs",
        _table(["Epoch", "Steps", "Iterator creation", "Iteration time", "Total time",
                "Rate (steps/s)"],
               [[str(i), str(e.total_steps), _format_duration(e.iterator_creation),
                 _format_duration(e.iteration_time), _format_duration(e.total_time),
                 _format_rate(_rate(e.total_steps, int(e.total_time / np.timedelta64(1, "ns"))))]
                for i, e in enumerate(metrics.epoch_metrics, 1)]),
        "",
        "Sampled steps",
        _table(["Epoch", "Epoch step", "Global step", "Local rate (steps/s)",
                "Global rate (steps/s)"] + list(profile_activities),
               [[str(i), str(b.epoch_step), str(b.global_step), _format_rate(b.local_rate),
                 _format_rate(b.global_rate)]
                + [_format_activity(a, b.profile_activities.get(a, "-"))
                   for a in profile_activities]
                for i, e in enumerate(metrics.epoch_metrics, 1) for b in e.batch_metrics]),
        "",
        "Batch specs",
        _table(["#", "Count", "First seen (epoch, step)", "Batch size", "Spec"],
               [[str(n), str(occ.count), f"({occ.epoch}, {occ.epoch_step})",
                 "-" if spec.batch_size is None else str(spec.batch_size), str(spec)]
                for n, (spec, occ) in enumerate(metrics.batch_specs.items(), 1)],
               left=(4,)),
    ]
    return "\n".join(out)
