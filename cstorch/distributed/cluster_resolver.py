"""`cstorch.distributed.cluster_resolver`: who is who among a run's streaming tasks.

On a Wafer-Scale Cluster each streaming worker learns its place in the job from the
cluster (`cstorch.distributed.service_resolver().cluster_spec`). Here the workers are
emulated in this process (`cstorch.utils.data.workers`), and the same description is
made from their layout: one `TaskSpec` per worker, numbered system by system.
"""
from dataclasses import dataclass
from collections.abc import Sequence

from cstorch.utils.data.workers import active_worker


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

    def task(self, rank: int | None = None) -> TaskSpec:
        """The task of `rank` (default: this process's, `self.rank`)."""
        rank = self.rank if rank is None else rank
        for task in self.tasks:
            if task.rank == rank:
                return task
        raise ValueError(f"no task of rank {rank} in this cluster spec (ranks "
                         f"{sorted(t.rank for t in self.tasks)})")


class BaseServiceResolver:
    """The cluster as a streaming task sees it: `cluster_spec` (a `ClusterSpec`) and the
    ordinals of the tasks by role. Here the tasks are the emulated streaming workers, so
    the spec is made from the active worker's layout (`setup`); there are no receiver
    tasks (outputs come back to this process)."""

    def __init__(self):
        self._cluster_spec = None

    @classmethod
    def get_resolver(cls) -> "BaseServiceResolver":
        """The resolver of the active streaming worker (a RuntimeError outside one)."""
        resolver = cls()
        resolver.setup()
        return resolver

    def setup(self) -> None:
        """Read the cluster's layout from the active streaming worker."""
        worker = active_worker()
        if worker is None:
            raise RuntimeError(
                "this is not a streaming worker: the cluster spec exists only while a CSX "
                "backend's DataLoader builds or iterates its dataloaders; check "
                "cstorch.distributed.is_streamer() first")
        layout = worker.layout
        self._cluster_spec = emulated_cluster_spec(layout.num_csx, layout.num_workers_per_csx,
                                                   worker.global_id)

    @property
    def cluster_spec(self) -> ClusterSpec:
        if self._cluster_spec is None:
            self.setup()
        return self._cluster_spec

    @property
    def cluster_resolver(self) -> "BaseServiceResolver":
        """What resolves the cluster's tasks: this resolver itself, as there is no
        cluster service to ask."""
        return self

    def streamer_ordinals(self) -> list[int]:
        """The ranks of the streaming tasks: every task of the emulated cluster."""
        return [task.rank for task in self.cluster_spec.tasks]

    def receiver_ordinals(self) -> list[int]:
        """The ranks of the receiver tasks: none here."""
        return []


class ServiceResolver(BaseServiceResolver):
    """What `cstorch.distributed.service_resolver()` returns: the cluster as this
    streaming task sees it."""

    def __init__(self, cluster_spec: ClusterSpec | None = None):
        super().__init__()
        self._cluster_spec = cluster_spec


def emulated_cluster_spec(num_csx: int, num_workers_per_csx: int, rank: int) -> ClusterSpec:
    """The cluster spec of emulated streaming workers: `num_csx * num_workers_per_csx`
    tasks numbered system by system, seen from the task of `rank`."""
    tasks: list[TaskSpec] = [
        TaskSpec(rank=i, local_rank=i % num_workers_per_csx, wse_id=i // num_workers_per_csx)
        for i in range(num_csx * num_workers_per_csx)]
    return ClusterSpec(tasks, rank, num_csx, num_workers_per_csx)


__all__ = ["TaskSpec", "ClusterSpec", "BaseServiceResolver", "ServiceResolver"]
