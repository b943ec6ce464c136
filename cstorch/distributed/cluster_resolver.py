"""`cstorch.distributed.cluster_resolver`: who is who among a run's streaming tasks.

On a Wafer-Scale Cluster each streaming worker learns its place in the job from the
cluster (`cstorch.distributed.service_resolver().cluster_spec`). Here the workers are
emulated in this process (`cstorch.utils.data.workers`), and the same description is
made from their layout: one `TaskSpec` per worker, numbered system by system.
"""
from dataclasses import dataclass
from typing import List, Optional, Sequence


@dataclass(frozen=True)
class TaskSpec:
    """One streaming task: `rank` among all of the run's tasks, `local_rank` among the
    tasks feeding the same system, `wse_id` that system's index, `node_name` the host it
    runs on."""
    rank: int
    local_rank: int
    wse_id: int
    node_name: str = "localhost"


@dataclass(frozen=True)
class ClusterSpec:
    """The run's tasks (`tasks`), the rank of this process's task (`rank`), and the
    layout: `num_csx` systems fed by `num_workers_per_csx` tasks each."""
    tasks: Sequence[TaskSpec]
    rank: int
    num_csx: int = 1
    num_workers_per_csx: int = 1

    def __post_init__(self):
        object.__setattr__(self, "tasks", tuple(self.tasks))

    def num_tasks(self) -> int:
        """The number of streaming tasks of the run: `num_csx * num_workers_per_csx`."""
        return self.num_csx * self.num_workers_per_csx

    def task(self, rank: Optional[int] = None) -> TaskSpec:
        """The task of `rank` (default: this process's, `self.rank`)."""
        rank = self.rank if rank is None else rank
        for task in self.tasks:
            if task.rank == rank:
                return task
        raise ValueError(f"no task of rank {rank} in this cluster spec (ranks "
                         f"{sorted(t.rank for t in self.tasks)})")


@dataclass(frozen=True)
class ServiceResolver:
    """What `cstorch.distributed.service_resolver()` returns: the cluster as this
    streaming task sees it."""
    cluster_spec: ClusterSpec


def emulated_cluster_spec(num_csx: int, num_workers_per_csx: int, rank: int) -> ClusterSpec:
    """The cluster spec of emulated streaming workers: `num_csx * num_workers_per_csx`
    tasks numbered system by system, seen from the task of `rank`."""
    tasks: List[TaskSpec] = [
        TaskSpec(rank=i, local_rank=i % num_workers_per_csx, wse_id=i // num_workers_per_csx)
        for i in range(num_csx * num_workers_per_csx)]
    return ClusterSpec(tasks, rank, num_csx, num_workers_per_csx)


__all__ = ["TaskSpec", "ClusterSpec", "ServiceResolver"]
