"""`cerebras.pytorch.distributed.worker_state`: the state of a streaming worker at a
checkpoint step, as `WorkerState`.

While `cstorch.utils.data.DataLoader.state_dict()` collects its workers' states, each
worker's `DataLoaderCheckpoint` is configured here and a `RestartableDataLoader`'s
`state_dict` reads it (`cstorch.distributed.get_worker_state()`).
"""
from cstorch.utils.data.workers import DataLoaderCheckpoint, current_worker_state


class WorkerState:
    """Where a streaming worker's state at the current checkpoint step is kept: one per
    process, used through its class methods."""

    _configured = None   # a state configured outside a DataLoader's collection of states

    @classmethod
    def configure(cls, worker_ckpt: DataLoaderCheckpoint) -> None:
        """Make `worker_ckpt` the state `get_worker_state` returns (None: no state)."""
        if worker_ckpt is not None and not isinstance(worker_ckpt, DataLoaderCheckpoint):
            raise TypeError(f"worker_ckpt must be a DataLoaderCheckpoint or None, got "
                            f"{type(worker_ckpt).__name__}")
        cls._configured = worker_ckpt

    @classmethod
    def get_worker_state(cls) -> DataLoaderCheckpoint:
        """The worker's state at the current checkpoint step: the one the DataLoader is
        collecting, else the one configured; a RuntimeError when there is neither."""
        state = current_worker_state()
        if state is None:
            state = cls._configured
        if state is None:
            raise RuntimeError(
                "cstorch.distributed.get_worker_state() may only be called inside the "
                "state_dict() method of a dataloader that implements the "
                "RestartableDataLoader protocol, while cstorch.utils.data.DataLoader."
                "state_dict() collects the workers' states (at a checkpoint step)")
        return state


__all__ = ["WorkerState", "DataLoaderCheckpoint"]
