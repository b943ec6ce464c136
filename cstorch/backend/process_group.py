"""A multi-process run (`backend("GPU", enable_distributed=True)`) on JAX's multi-controller
runtime.

Processes are launched by `torchrun` (or given its environment: RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR, MASTER_PORT). They meet through `torch.distributed`'s rendezvous
(`init_method`, as in `torch.distributed.init_process_group`), which also leaves a gloo
process group for host-side coordination. Process 0 then picks a free port for JAX's
coordination service and hands its address to the others through the rendezvous store, and
every process calls `jax.distributed.initialize`. From there one XLA program runs over all
processes' devices and XLA's collectives (NCCL on GPUs, gloo on CPUs) move the data.
"""
import os
import socket
from dataclasses import dataclass
from datetime import timedelta

import jax
import torch.distributed as dist
from jax._src import xla_bridge

# dist_backend -> the JAX platform whose devices the run uses.
PLATFORMS = {"nccl": "gpu", "gloo": "cpu"}
_COORDINATOR_KEY = "cstorch/jax_coordinator"


@dataclass(frozen=True)
class ProcessGroup:
    rank: int
    world_size: int
    local_rank: int
    main_process_id: int
    platform: str

    @property
    def is_main(self) -> bool:
        return self.rank == self.main_process_id


_group: ProcessGroup | None = None


def current() -> ProcessGroup | None:
    """The process group of this process's run, or None outside a multi-process run."""
    return _group


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None


def initialize(dist_backend: str, init_method: str | None, main_process_id: int,
               timeout_s: float = 300.0) -> ProcessGroup:
    """Join this process to the run's other processes (once per process)."""
    global _group
    if dist_backend not in PLATFORMS:
        raise ValueError(
            f"dist_backend {dist_backend!r} is not supported: use \"nccl\" (GPUs, XLA's NCCL "
            f"collectives) or \"gloo\" (CPU devices, XLA's gloo collectives)")
    if _group is not None:
        if PLATFORMS[dist_backend] != _group.platform or main_process_id != _group.main_process_id:
            raise RuntimeError(
                "this process already joined a distributed run with other settings "
                f"(dist_backend for platform {_group.platform!r}, main_process_id "
                f"{_group.main_process_id}); a process joins one run only")
        return _group
    rank, world_size = _env_int("RANK"), _env_int("WORLD_SIZE")
    if init_method in (None, "env://") and (rank is None or world_size is None):
        raise RuntimeError(
            "enable_distributed=True needs the process to be launched by torchrun "
            "(python -m torch.distributed.run --nproc_per_node N script.py) or the same "
            "environment variables: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; or pass "
            "init_method (\"tcp://host:port\" or \"file:///path\") with RANK and WORLD_SIZE set")
    if world_size is not None and not 0 <= main_process_id < world_size:
        raise ValueError(f"main_process_id {main_process_id} is not a rank of this run "
                         f"(WORLD_SIZE={world_size}); use a rank from 0 to {world_size - 1}")
    if xla_bridge.backends_are_initialized():
        raise RuntimeError(
            "JAX was already used in this process before the distributed backend was created; "
            "jax.distributed must start first. Create cstorch.backend(\"GPU\", "
            "enable_distributed=True, ...) before anything runs on JAX devices")
    platform = PLATFORMS[dist_backend]
    if not dist.is_initialized():
        # The host-side group is gloo whatever dist_backend says: device traffic goes
        # through XLA, the group only rendezvouses and serves host coordination.
        dist.init_process_group("gloo", init_method=init_method or "env://",
                                rank=-1 if rank is None else rank,
                                world_size=-1 if world_size is None else world_size,
                                timeout=timedelta(seconds=timeout_s))
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if not 0 <= main_process_id < world_size:
        raise ValueError(f"main_process_id {main_process_id} is not a rank of this run "
                         f"(world size {world_size}); use a rank from 0 to {world_size - 1}")
    store = dist.distributed_c10d._get_default_store()
    if rank == 0:
        store.set(_COORDINATOR_KEY, _free_address())
    coordinator = store.get(_COORDINATOR_KEY).decode()
    local_rank = _env_int("LOCAL_RANK")
    local_rank = rank if local_rank is None else local_rank
    if platform == "cpu":
        jax.config.update("jax_platforms", "cpu")
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    kwargs = {}
    if platform == "gpu" and os.environ.get("CUDA_VISIBLE_DEVICES") is None:
        kwargs["local_device_ids"] = [local_rank]   # one GPU per process, as torchrun lays out
    jax.distributed.initialize(coordinator, num_processes=world_size, process_id=rank,
                               initialization_timeout=int(timeout_s), **kwargs)
    _group = ProcessGroup(rank, world_size, local_rank, main_process_id, platform)
    return _group


def _free_address() -> str:
    """host:port for JAX's coordination service on this (the first) process."""
    host = os.environ.get("MASTER_ADDR") or socket.gethostbyname(socket.gethostname())
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    return f"{host}:{port}"


def devices(group: ProcessGroup) -> list:
    """Every process's devices of the run's platform, process by process, so that a mesh
    whose first axis is the processes gives each process its own devices' row."""
    try:
        found = jax.devices(group.platform)
    except RuntimeError:
        raise RuntimeError(
            f"dist_backend needs {group.platform.upper()} devices and JAX sees none; use "
            f"dist_backend=\"gloo\" to run on CPU devices") from None
    return sorted(found, key=lambda d: (d.process_index, d.id))


def global_shape(shape: tuple, world_size: int) -> tuple:
    """The global batch's shape for one process's part of it: the first dimension times
    the number of processes (0-d values are whole on every process)."""
    return (shape[0] * world_size, *shape[1:]) if shape else tuple(shape)


def global_inputs(values: list, shardings: list, world_size: int) -> list:
    """A step's inputs over all processes, from this process's parts of them (numpy
    arrays, or device arrays of this process)."""
    out = []
    for value, sharding in zip(values, shardings):
        if isinstance(value, jax.Array) and not value.is_fully_addressable:
            out.append(value)   # already global (a result of an earlier step)
            continue
        out.append(jax.make_array_from_process_local_data(
            sharding, value, global_shape(tuple(value.shape), world_size)))
    return out
