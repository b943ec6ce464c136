"""Streaming workers: who streams which batch, and what each has streamed.

A Wafer-Scale Cluster feeds each system from `num_workers_per_csx` streaming workers,
each with its own dataloader built by calling the user's input function; a system's steps
are taken from its workers in turn (round-robin by local worker id). Here the workers
are emulated in this process: same layout, same counters, same calls, so an input
function that shards its data by `cstorch.distributed.get_streaming_rank()` behaves as
it would on a cluster.
"""
import contextlib
import contextvars
from dataclasses import dataclass
from collections.abc import Iterator

from cstorch.utils.data.utils import infer_batch_size


@dataclass
class DataLoaderCheckpoint:
    """A streaming worker's view of the run at a checkpoint step.

    `appliance_step`, `worker_step` and `samples_streamed` change from step to step; the
    other fields describe the run's layout. Counters start from zero in every run, also in
    one restored from a checkpoint.
    """
    global_worker_id: int
    local_worker_id: int
    total_num_workers: int
    num_workers_per_csx: int
    num_csx: int
    wse_id: int
    appliance_step: int
    worker_step: int
    samples_streamed: int


@dataclass(frozen=True)
class Layout:
    """How many systems the run feeds and how many workers stream to each."""
    num_csx: int = 1
    num_workers_per_csx: int = 1

    @property
    def total(self) -> int:
        return self.num_csx * self.num_workers_per_csx

    def worker(self, global_id: int) -> tuple[int, int]:
        """(system, local id) of a worker; workers are numbered system by system."""
        return divmod(global_id, self.num_workers_per_csx)


class Worker:
    """One emulated streaming worker: its dataloader, its iterator and its counters."""

    def __init__(self, global_id: int, layout: Layout, streams: bool):
        self.global_id = global_id
        self.layout = layout
        self.wse_id, self.local_id = layout.worker(global_id)
        # On a CSX backend the workers are streamers (cstorch.distributed.is_streamer());
        # on CPU and GPU backends the input function runs as plain client code.
        self.streams = streams
        self.loader = None
        self._iterator: Iterator | None = None
        self.worker_step = 0
        self.samples_streamed = 0
        self.last_samples = 0   # samples in the last batch it streamed

    @contextlib.contextmanager
    def active(self):
        """While inside, `cstorch.distributed` answers for this worker."""
        token = _active_worker.set(self if self.streams else None)
        try:
            yield self
        finally:
            _active_worker.reset(token)

    def build(self, input_fn, args, kwargs):
        with self.active():
            self.loader = input_fn(*args, **kwargs)
        try:
            iter(self.loader)
        except TypeError:
            raise TypeError(f"the DataLoader's input_fn must return an iterable (a "
                            f"torch.utils.data.DataLoader, say), it returned "
                            f"{type(self.loader).__name__}") from None

    def next_batch(self, repeat: bool):
        """The worker's next batch. At the end of a pass: with `repeat`, a new pass begins
        (a RuntimeError if it is empty); without, StopIteration."""
        if not self.streams and _active_worker.get() is None:
            return self._next(repeat)   # setting None over None: nothing to do (every step)
        # `active()` without the generator-based context manager: this runs every step.
        token = _active_worker.set(self if self.streams else None)
        try:
            return self._next(repeat)
        finally:
            _active_worker.reset(token)

    def took(self, batch):
        """Count `batch` as streamed by this worker; returns it."""
        self.worker_step += 1
        self.last_samples = infer_batch_size(batch) or 0
        self.samples_streamed += self.last_samples
        return batch

    def _next(self, repeat: bool):
        if self._iterator is None:
            self._iterator = iter(self.loader)
        try:
            return next(self._iterator)
        except StopIteration:
            self._iterator = None
            if not repeat:
                raise
        self._iterator = iter(self.loader)
        try:
            return next(self._iterator)
        except StopIteration:
            self._iterator = None
            raise RuntimeError(
                f"streaming worker {self.global_id}'s dataloader produced no batches in a "
                f"pass: its input_fn returned an empty dataloader (check the dataset's "
                f"size against the batch size, and drop_last)") from None

    def reset_pass(self):
        self._iterator = None

    def checkpoint(self, appliance_step: int) -> DataLoaderCheckpoint:
        return DataLoaderCheckpoint(
            global_worker_id=self.global_id, local_worker_id=self.local_id,
            total_num_workers=self.layout.total,
            num_workers_per_csx=self.layout.num_workers_per_csx, num_csx=self.layout.num_csx,
            wse_id=self.wse_id, appliance_step=appliance_step, worker_step=self.worker_step,
            samples_streamed=self.samples_streamed)


_active_worker: contextvars.ContextVar[Worker | None] = contextvars.ContextVar(
    "cstorch_streaming_worker", default=None)
_worker_state: contextvars.ContextVar[DataLoaderCheckpoint | None] = contextvars.ContextVar(
    "cstorch_worker_state", default=None)


def active_worker() -> Worker | None:
    return _active_worker.get()


@contextlib.contextmanager
def worker_state(state: DataLoaderCheckpoint):
    """Makes `get_worker_state()` return `state` while a loader's `state_dict` runs."""
    token = _worker_state.set(state)
    try:
        yield
    finally:
        _worker_state.reset(token)


def current_worker_state() -> DataLoaderCheckpoint | None:
    return _worker_state.get()
