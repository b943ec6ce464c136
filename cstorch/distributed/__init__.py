"""`cerebras.pytorch.distributed`: the streaming workers' view of a run, and the run's
processes.

On a CSX backend the dataloader is built by emulated streaming workers (see
`cstorch.utils.data.DataLoader`); while a worker builds or iterates its loader these
functions describe it, so an input function can shard its data the way it would on a
Wafer-Scale Cluster. Outside a worker, `is_streamer()` is False.

`get_ordinal`, `num_tasks` and `is_master_ordinal` describe this process among the run's
processes: in a multi-process run (`cstorch.backend("GPU", enable_distributed=True)`,
`cstorch.backend.process_group`) its rank, the world size and whether it is the main
process; otherwise 0, 1 and True. The emulated streaming workers run inside this process,
so they see the same values. `ClusterConfig`, `cluster_resolver`, `service_resolver`,
`WORKER_CACHE_ROOT` and `hit_worker_cache_limit` are the cluster's plumbing, made from the
emulated layout.
"""
import enum

from cstorch.backend import process_group
from cstorch.distributed import cluster_resolver, worker_state
from cstorch.distributed.cluster_config import ClusterConfig
from cstorch.distributed.cluster_resolver import (BaseServiceResolver, ServiceResolver,
                                                  emulated_cluster_spec)
from cstorch.distributed.worker_cache import WORKER_CACHE_ROOT, hit_worker_cache_limit, tree_size
from cstorch.distributed.worker_state import WorkerState
from cstorch.utils.data.workers import DataLoaderCheckpoint, active_worker


class TaskRole(enum.Enum):
    """The role of a task in a run's cluster: a streaming worker feeds inputs to the
    systems, a receiver takes their outputs. Only streamers exist here (emulated in this
    process); outputs come back to this process directly."""
    STREAMER = "streamer"
    RECEIVER = "receiver"


def get_worker_state() -> DataLoaderCheckpoint:
    """What this streaming worker has streamed at the current checkpoint step, as a
    `DataLoaderCheckpoint`.

    Only defined inside the `state_dict` method of a dataloader that follows the
    `RestartableDataLoader` protocol (while `cstorch.utils.data.DataLoader.state_dict()`
    collects the workers' states); anywhere else it raises a RuntimeError. The counters
    start from zero in every run.
    """
    return WorkerState.get_worker_state()


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


def is_receiver() -> bool:
    """True inside a receiver task; there are none here (outputs come back to this
    process), so always False."""
    return False


def num_receivers() -> int:
    """The number of receiver tasks of the run: 0 here (see `is_receiver`)."""
    return 0


def get_streaming_batch_size(effective_batch_size: int, global_rank: int = None) -> int:
    """The per-system batch size the streaming worker of `global_rank` (default: this
    one) produces for a global batch of `effective_batch_size`, split evenly over the
    run's systems."""
    worker = active_worker()
    systems = worker.layout.num_csx if worker is not None else 1
    if global_rank is not None:
        total = worker.layout.total if worker is not None else 1
        if not isinstance(global_rank, int) or not 0 <= global_rank < total:
            raise ValueError(f"global_rank must be a streaming rank in [0, {total}), got "
                             f"{global_rank!r}")
    if effective_batch_size % systems:
        raise ValueError(f"the batch size {effective_batch_size} does not split evenly over "
                         f"{systems} systems; use a multiple of {systems}")
    return effective_batch_size // systems


def _process_group():
    return process_group.current()


def get_ordinal() -> int:
    """This process's rank in the run: its rank in a multi-process run, else 0."""
    group = _process_group()
    return group.rank if group is not None else 0


def num_tasks() -> int:
    """The number of processes in the run: the world size of a multi-process run, else 1."""
    group = _process_group()
    return group.world_size if group is not None else 1


def is_master_ordinal(local: bool = False) -> bool:
    """Whether this is the run's main process, the one that writes its files and
    downloads shared data: in a multi-process run the process `main_process_id`
    (`cstorch.backend("GPU", ..., main_process_id=...)`), else always True. With `local`,
    whether it is the main process of its node (local rank 0)."""
    group = _process_group()
    if group is None:
        return True
    return group.local_rank == 0 if local else group.is_main


def get_dir_size(path) -> int:
    """The size in bytes of the files under `path` (a file's own size; links are not
    followed; 0 if it does not exist)."""
    return tree_size(path)


def service_resolver() -> ServiceResolver:
    """The cluster as this streaming worker sees it: `.cluster_spec` is a
    `cluster_resolver.ClusterSpec` with one task per emulated worker (numbered system by
    system), `.cluster_spec.task()` this worker's. Only inside a streaming worker (check
    `is_streamer()` first), as on a Wafer-Scale Cluster."""
    worker = _worker()
    layout = worker.layout
    return ServiceResolver(emulated_cluster_spec(layout.num_csx, layout.num_workers_per_csx,
                                                 worker.global_id))


__all__ = ["TaskRole", "WorkerState", "worker_state", "BaseServiceResolver", "is_receiver",
           "num_receivers", "get_dir_size", "get_worker_state", "is_streamer", "num_streamers", "get_streaming_rank",
           "get_streaming_batch_size", "DataLoaderCheckpoint", "get_ordinal", "num_tasks",
           "is_master_ordinal", "ClusterConfig", "cluster_resolver", "service_resolver",
           "WORKER_CACHE_ROOT", "hit_worker_cache_limit"]
