"""`cstorch.utils.data.DataLoader`, and the protocol that makes a dataloader restartable."""
import inspect
import itertools
import warnings
from typing import Any, Protocol, runtime_checkable
from collections.abc import Callable

import torch
import torch.utils._pytree as pytree

from cstorch.run import current
from cstorch.utils.data.workers import Layout, Worker, worker_state

# Where a DataLoader with several workers per system keeps its round-robin position in
# the aggregated state dict, so that a restored run resumes with the worker that was next.
ROUND_ROBIN_KEY = "__cstorch_streaming__"


@runtime_checkable
class RestartableDataLoader(Protocol):
    """What a dataloader implements so that a run restored from a checkpoint resumes its
    data where the checkpoint was taken.

    Each streaming worker's `state_dict()` is collected at a checkpoint step (where
    `cstorch.distributed.get_worker_state()` tells it what it streamed), the list is
    combined by `aggregate_state_dict` into the state that is saved, and on restore each
    worker gets `load_state_dict(deaggregate_state_dict(saved))`. Any object with these
    four methods qualifies; it need not inherit from this class.
    """

    def state_dict(self) -> dict[str, Any]:
        """This worker's state at a checkpoint step."""

    def load_state_dict(self, state_dict: dict[str, Any], strict: bool = True) -> None:
        """Restore this worker from what `deaggregate_state_dict` returned."""

    def aggregate_state_dict(self, worker_states: list[dict[str, Any]]) -> dict[str, Any]:
        """Combine every worker's `state_dict()` into the state that is saved."""

    def deaggregate_state_dict(self, aggregated_state_dict: dict[str, Any],
                               strict: bool = True) -> dict[str, Any]:
        """The part of a saved state that this worker's `load_state_dict` takes."""


def _concat(batches: list):
    """One global batch from the per-system batches of a step (along dim 0)."""
    leaves, spec = pytree.tree_flatten(batches[0])
    others = [pytree.tree_flatten(b) for b in batches[1:]]
    if any(s != spec for _, s in others):
        raise ValueError("the streaming workers of different systems produced batches of "
                         "different structure; every worker's input_fn must yield the same one")
    out = []
    for i, leaf in enumerate(leaves):
        parts = [leaf] + [o[0][i] for o in others]
        if isinstance(leaf, torch.Tensor) and leaf.dim() > 0:
            out.append(torch.cat(parts))
        elif all(p == leaf for p in parts[1:]):
            out.append(leaf)
        else:
            raise ValueError(f"the systems' batches differ in a non-tensor field "
                             f"({parts!r}); only tensors with a batch dimension can be combined")
    return pytree.tree_unflatten(out, spec)


_ids = itertools.count()


def _with_strict(method, state, strict):
    """`method(state, strict=strict)`, or `method(state)` where the dataloader's method
    takes no `strict` (Model Zoo's HDF5 iterable data processors define theirs so)."""
    try:
        params = inspect.signature(method).parameters
    except (TypeError, ValueError):   # a builtin without a signature: the protocol's call
        return method(state, strict=strict)
    if "strict" in params or any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return method(state, strict=strict)
    return method(state)


class DataLoader:
    """A dataloader that each streaming worker builds for itself.

    `input_fn(*args, **kwargs)` returns a `torch.utils.data.DataLoader` or any iterable of
    (structures of) tensors. Every worker calls it for its own loader, so for each worker to
    stream different data, `input_fn` shards by `cstorch.distributed.get_streaming_rank()`
    out of `num_streamers()`. On CPU and GPU backends there is one worker; on a CSX backend,
    `num_workers_per_csx` per system of its `cluster_config`, taken in turn, and a step's
    batch joins one batch from each system along dimension 0.

    `state_dict()` and `load_state_dict()` save and restore the position of a loader that
    follows the `RestartableDataLoader` protocol (or has its own `state_dict`).
    """

    def __init__(self, input_fn: Callable, *args, **kwargs):
        if not callable(input_fn):
            raise TypeError(
                f"DataLoader expects an input function that returns a dataloader, got "
                f"{type(input_fn).__name__}; wrap it: DataLoader(lambda: my_loader)")
        self.input_fn = input_fn
        self.input_args = args
        self.input_kwargs = kwargs
        # Tells dataloaders of a process apart (Model Zoo's trainer keys each validation
        # dataloader's schedule and metrics by it).
        self.id = next(_ids)
        self._workers: list[Worker] | None = None
        self._layout: Layout | None = None
        self._pending_state = None
        self._next_local = 0     # the local worker id that streams the next step
        self._steps = 0          # steps streamed in this process (the appliance step)
        self.last_samples = 0    # samples in the last batch streamed
        self._warned_stateless = False

    # workers ---------------------------------------------------------------------------
    def use_layout(self, layout: Layout):
        """Stream with `layout` (the executor's); an error once workers of another exist."""
        if self._workers is not None and self._layout != layout:
            raise RuntimeError(
                f"this DataLoader already streams with {self._layout.num_csx} system(s) x "
                f"{self._layout.num_workers_per_csx} worker(s), not {layout.num_csx} x "
                f"{layout.num_workers_per_csx}; create a new DataLoader for the new layout")
        self._layout = layout

    def workers(self) -> list[Worker]:
        if self._workers is None:
            layout = self._layout or _backend_layout()
            self._layout = layout
            streams = _backend_is_csx()
            workers = [Worker(i, layout, streams) for i in range(layout.total)]
            for w in workers:
                w.build(self.input_fn, self.input_args, self.input_kwargs)
            self._workers = workers
            if self._pending_state is not None:
                state, strict = self._pending_state
                self._pending_state = None
                self._restore(state, strict)
        return self._workers

    @property
    def dataloader(self):
        """The dataloader `input_fn` returned (the first worker's, where there are several)."""
        return self.workers()[0].loader

    @property
    def num_workers(self) -> int:
        return len(self.workers())

    def next_batch(self):
        """The next step's batch; a worker at the end of its pass starts a new one."""
        return self._step(repeat=True)

    def _step(self, repeat: bool):
        workers = self._workers or self.workers()
        if len(workers) == 1:   # the common case, without the lists below (runs every step)
            worker = workers[0]
            batch = worker.took(worker.next_batch(repeat))
            self.last_samples = worker.last_samples
            self._steps += 1
            return batch
        per = self._layout.num_workers_per_csx
        chosen = [workers[system * per + self._next_local] for system in range(self._layout.num_csx)]
        batches = [w.next_batch(repeat) for w in chosen]
        for w, b in zip(chosen, batches):
            w.took(b)
        self.last_samples = sum(w.last_samples for w in chosen)
        self._next_local = (self._next_local + 1) % per
        self._steps += 1
        return batches[0] if len(batches) == 1 else _concat(batches)

    def __iter__(self):
        """One pass: batches until a worker's loader runs out."""
        for w in self.workers():   # built here, so that a bad input_fn fails at iter()
            w.reset_pass()
        return self._one_pass()

    def _one_pass(self):
        while True:
            try:
                yield self._step(repeat=False)
            except StopIteration:
                return

    def __len__(self):
        """Steps in one pass: the lengths of one system's workers' loaders, summed."""
        per = self.workers()[: self._layout.num_workers_per_csx]
        try:
            return sum(len(w.loader) for w in per)
        except TypeError:
            raise TypeError(f"the dataloader returned by input_fn "
                            f"({type(per[0].loader).__name__}) has no length") from None

    # state -----------------------------------------------------------------------------
    @property
    def is_restartable(self) -> bool:
        """Whether the dataloader `input_fn` returns is a `RestartableDataLoader`."""
        return isinstance(self.dataloader, RestartableDataLoader)

    def state_dict(self) -> dict[str, Any]:
        """The dataloader's state for a checkpoint.

        A `RestartableDataLoader`: every worker's `state_dict()` (inside which
        `cstorch.distributed.get_worker_state()` describes the worker), combined by
        `aggregate_state_dict`. Another loader with a `state_dict` method: its own. Else an
        empty dict, with a warning that the position is not saved.
        """
        workers = self.workers()
        first = workers[0].loader
        if isinstance(first, RestartableDataLoader):
            states = []
            for w in workers:
                with w.active(), worker_state(w.checkpoint(self._steps)):
                    states.append(w.loader.state_dict())
            aggregated = first.aggregate_state_dict(states)
            if self._layout.num_workers_per_csx > 1 and isinstance(aggregated, dict):
                aggregated = {**aggregated, ROUND_ROBIN_KEY: {
                    "next_local_worker": self._next_local,
                    "num_workers_per_csx": self._layout.num_workers_per_csx}}
            return aggregated
        if len(workers) == 1 and hasattr(first, "state_dict"):
            return first.state_dict()
        if not self._warned_stateless:
            self._warned_stateless = True
            warnings.warn(
                f"the dataloader ({type(first).__name__}) does not implement the "
                f"RestartableDataLoader protocol (state_dict, load_state_dict, "
                f"aggregate_state_dict, deaggregate_state_dict), so its position is not saved: "
                f"a run restored from this checkpoint streams its data from the beginning",
                stacklevel=2)
        return {}

    def load_state_dict(self, state_dict: dict[str, Any], strict: bool = True):
        """Restore the position saved by `state_dict()`: the next batch streamed is the
        one that followed the checkpoint."""
        if not isinstance(state_dict, dict):
            raise TypeError(f"DataLoader.load_state_dict expects the dict that "
                            f"DataLoader.state_dict() returned, got {type(state_dict).__name__}")
        if self._workers is None:
            self._pending_state = (state_dict, strict)
            self.workers()
        else:
            self._restore(state_dict, strict)

    def _restore(self, state_dict, strict):
        workers = self._workers
        first = workers[0].loader
        if isinstance(first, RestartableDataLoader):
            aggregated = dict(state_dict)
            position = aggregated.pop(ROUND_ROBIN_KEY, None)
            for w in workers:
                with w.active():
                    state = _with_strict(w.loader.deaggregate_state_dict, aggregated, strict)
                    _with_strict(w.loader.load_state_dict, state, strict)
                w.reset_pass()
            per = self._layout.num_workers_per_csx
            self._next_local = 0
            if position is not None:
                if position["num_workers_per_csx"] == per:
                    self._next_local = position["next_local_worker"]
                else:
                    warnings.warn(
                        f"the checkpoint was taken with {position['num_workers_per_csx']} "
                        f"streaming workers per system, this run has {per}: worker 0 streams "
                        f"first, so batches may come in a different order than in that run",
                        stacklevel=3)
        elif len(workers) == 1 and hasattr(first, "load_state_dict"):
            first.load_state_dict(state_dict)
        elif state_dict and strict:
            raise RuntimeError(
                f"the dataloader ({type(first).__name__}) has no load_state_dict to restore "
                f"this state into; implement the RestartableDataLoader protocol, or pass "
                f"strict=False to ignore the saved state")


def _backend_layout() -> Layout:
    backend = current.backend()
    config = backend.params.get("cluster_config") if backend is not None else None
    if config is None:
        return Layout()
    return Layout(getattr(config, "num_csx", 1), getattr(config, "num_workers_per_csx", 1))


def _backend_is_csx() -> bool:
    backend = current.backend()
    return backend is not None and backend.is_csx
