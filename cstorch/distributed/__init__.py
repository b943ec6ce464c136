"""`cerebras.pytorch.distributed`: the streaming workers' view of a run, and the run's
processes.

On a CSX backend the dataloader is built by emulated streaming workers (see
`cstorch.utils.data.DataLoader`); while a worker builds or iterates its loader these
functions describe it, so an input function can shard its data the way it would on a
Wafer-Scale Cluster. Outside a worker, `is_streamer()` is False.

`get_ordinal`, `num_tasks` and `is_master_ordinal` describe this process among the run's
processes: in a multi-process run (`cstorch.backend("GPU", enable_distributed=True)`,
`cstorch.distributed.process_group`) its rank, the world size and whether it is the main
process; otherwise 0, 1 and True. The emulated streaming workers run inside this process,
so they see the same values. `ClusterConfig`, `cluster_resolver`, `service_resolver`,
`WORKER_CACHE_ROOT` and `hit_worker_cache_limit` are the cluster's plumbing, made from the
emulated layout.
"""
from cstorch.distributed import cluster_resolver
from cstorch.distributed.cluster_config import ClusterConfig
from cstorch.distributed.cluster_resolver import ServiceResolver, emulated_cluster_spec
from cstorch.distributed.worker_cache import WORKER_CACHE_ROOT, hit_worker_cache_limit
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


def _process_group():
    from cstorch.distributed import process_group
    return process_group.current()


def get_ordinal() -> int:
    """This process's rank in the run: its rank in a multi-process run, else 0."""
    group = _process_group()
    return group.rank if group is not None else 0


def num_tasks() -> int:
    """The number of processes in the run: the world size of a multi-process run, else 1."""
    group = _process_group()
    return group.world_size if group is not None else 1


def is_master_ordinal() -> bool:
    """Whether this is the run's main process, the one that writes its files and
    downloads shared data: in a multi-process run the process `main_process_id`
    (`cstorch.backend("GPU", ..., main_process_id=...)`), else always True."""
    group = _process_group()
    return group is None or group.is_main


def service_resolver() -> ServiceResolver:
    """The cluster as this streaming worker sees it: `.cluster_spec` is a
    `cluster_resolver.ClusterSpec` with one task per emulated worker (numbered system by
    system), `.cluster_spec.task()` this worker's. Only inside a streaming worker (check
    `is_streamer()` first), as on a Wafer-Scale Cluster."""
    worker = _worker()
    layout = worker.layout
    return ServiceResolver(emulated_cluster_spec(layout.num_csx, layout.num_workers_per_csx,
                                                 worker.global_id))


__all__ = ["get_worker_state", "is_streamer", "num_streamers", "get_streaming_rank",
           "get_streaming_batch_size", "DataLoaderCheckpoint", "get_ordinal", "num_tasks",
           "is_master_ordinal", "ClusterConfig", "cluster_resolver", "service_resolver",
           "WORKER_CACHE_ROOT", "hit_worker_cache_limit"]
