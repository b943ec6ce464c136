"""`cerebras.pytorch.distributed`: the streaming workers' view of a run.

On a CSX backend the dataloader is built by emulated streaming workers (see
`cstorch.utils.data.DataLoader`); while a worker builds or iterates its loader these
functions describe it, so an input function can shard its data the way it would on a
Wafer-Scale Cluster. Outside a worker, `is_streamer()` is False.
"""
from cstorch.utils.data.workers import DataLoaderCheckpoint, active_worker, current_worker_state


def get_worker_state() -> DataLoaderCheckpoint:
    """What this streaming worker has streamed at the current checkpoint step, as a
    `DataLoaderCheckpoint`.

    Only defined inside the `state_dict` method of a dataloader that follows the
    `RestartableDataLoader` protocol (while `cstorch.utils.data.DataLoader.state_dict()`
    collects the workers' states); anywhere else it raises a RuntimeError. The counters
    start from zero in every run.
    """
    state = current_worker_state()
    if state is None:
        raise RuntimeError(
            "cstorch.distributed.get_worker_state() may only be called inside the state_dict() "
            "method of a dataloader that implements the RestartableDataLoader protocol, while "
            "cstorch.utils.data.DataLoader.state_dict() collects the workers' states (at a "
            "checkpoint step)")
    return state


def is_streamer() -> bool:
    """True inside a streaming worker (a CSX run's input function and its iteration)."""
    return active_worker() is not None


def _worker():
    worker = active_worker()
    if worker is None:
        raise RuntimeError(
            "this is not a streaming worker: streaming ranks exist only while a CSX backend's "
            "DataLoader builds or iterates its dataloaders; check cstorch.distributed."
            "is_streamer() first")
    return worker


def num_streamers() -> int:
    """The number of streaming workers of the run, over all systems."""
    return _worker().layout.total


def get_streaming_rank() -> int:
    """This streaming worker's id among all of the run's workers."""
    return _worker().global_id


def get_streaming_batch_size(effective_batch_size: int) -> int:
    """The per-system batch size a streaming worker produces for a global batch of
    `effective_batch_size`, split evenly over the run's systems."""
    worker = active_worker()
    systems = worker.layout.num_csx if worker is not None else 1
    if effective_batch_size % systems:
        raise ValueError(f"the batch size {effective_batch_size} does not split evenly over "
                         f"{systems} systems; use a multiple of {systems}")
    return effective_batch_size // systems


__all__ = ["get_worker_state", "is_streamer", "num_streamers", "get_streaming_rank",
           "get_streaming_batch_size", "DataLoaderCheckpoint"]
