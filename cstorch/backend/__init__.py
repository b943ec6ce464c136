"""`cstorch.backend(...)`: the one backend of a run, its devices, mesh and state.

`cerebras.pytorch.backend` is a package, as in the reference: `Backend`,
`BackendType` and `get_backend_args` (`types`), `current_backend_impl`, `use_cs`, and the
submodules `ltc_backend` (hooks on values copied to the host) and `cluster` (a backend's
`cluster`). `cstorch.backend`, the attribute of the `cstorch` package, is the function
`backend(...)` below; `importlib.import_module("cstorch.backend")` gives this module.
"""
import json
import os
import sys
import warnings

import jax
import torch

import wafer
from bridge.device_tensor import HostReads
from bridge.precision import MatmulPolicy
from cstorch.backend import ltc_backend
from cstorch.backend import process_group
from cstorch.backend.cluster import Cluster
from cstorch.backend.device import Device
from cstorch.backend.types import (BOOL_PARAMS, DISTRIBUTED_ONLY, PARAMS, BackendType,
                                   get_backend_args)
from cstorch.backends import csx
from cstorch.errors import BackendError, ConfigurationError
from cstorch.run import current
from cstorch.run.capture_context import is_capturing
from cstorch.run.current import current_backend_impl
from cstorch.state import RunState
from cstorch.weak_registry import WeakRegistry

# Before the user's code starts threads: a thread that allocates before glibc is held to one
# arena keeps one of its own, and XLA's threads may later be handed it (wafer.host_memory).
wafer.host_memory.one_arena()

# Set only by a test suite that runs many independent runs in one process
# (tests/conftest.py): a new backend then replaces the current one instead of being
# refused. Whatever was made on the replaced backend is unusable afterwards.
_replacing_allowed = False


class BackendMeta(type):
    """The metaclass of `Backend`: a process has one backend.

    A run's compiled modules, optimizers and data executors all belong to the backend they
    were made on; a second backend would leave them behind and make a model compiled on
    the first unusable. So, as in the reference, instantiating a backend while one exists
    is refused; `cstorch.backend()` without arguments returns the existing one.
    """

    def __call__(cls, *args, **kwargs):
        existing = current.backend()
        if existing is not None and not _replacing_allowed:
            raise BackendError(
                f"cannot instantiate a second backend: a {existing.backend_type} backend "
                f"already exists in this process, and only one backend may be created per "
                f"run. Use cstorch.backend() to get the existing one.")
        instance = super().__call__(*args, **kwargs)
        current.set_backend(instance)
        return instance


class Backend(metaclass=BackendMeta):
    """A backend of type "CSX", "CPU" or "GPU".

    All three run steps the same way, as one XLA program per traced step; they differ in
    the JAX devices they use and the mesh laid over them:
    - "CPU": the first JAX CPU device.
    - "GPU": every JAX GPU device, the batch split across them.
    - "CSX": an emulated wafer, a (systems, rows, cols) mesh over every JAX device.

    Parameters are those the reference lists per type; `artifact_dir` defaults to
    ``$cwd/cerebras_logs``. A CSX backend also takes `cluster_config`, a
    `cstorch.distributed.ClusterConfig` (or `cstorch.utils.CSConfig`) whose `num_csx`
    splits the mesh into that many systems; `backend.cluster.config` reads and replaces it.
    `backend_type` is a `BackendType`, equal to its name as a str ("CSX").
    On a CSX backend:
    - `compile_only`: steps are captured, lowered and compiled, never executed; state
      stays on the host (nothing is placed on the devices) and is never changed.
    - `validate_only`: steps are captured and lowered only (no XLA compilation).
    - `drop_data`: the initial values of the model and optimizer are dropped; a step runs
      once a checkpoint has given every state tensor a value.
    - `compile_dir` (when given): the persistent cache of compiled steps.
    - `log_initialization`: a progress bar while `cstorch.compile` places the state.
    `device` (printed as the type, "CSX", "CPU" or "GPU") is the context to build a model
    in: on CSX with `cstorch.backends.csx.debug.lazy_initialization` (the default) tensors
    created inside it hold no host data and are built on the devices by `cstorch.compile`;
    on CPU and GPU they are created eagerly by PyTorch (`cstorch.lazy_init`).
    A CPU or CSX backend, made before JAX's CPU client, asks glibc to keep freed buffers
    for reuse (`wafer.keep_buffers_mapped`), so that each step reuses its scratch memory
    instead of faulting fresh pages in; for that, importing cstorch already holds glibc to
    one malloc arena (`wafer.host_memory.one_arena`). A run whose state reaches 1 GiB
    gives each buffer of 1 MiB or more its own mapping instead, returned when freed, so
    that its peak memory is what it holds at once (`wafer.host_memory.fit_to_state`). A
    user's own `MALLOC_*` variable or `glibc.malloc.*` tunable leaves glibc as the user
    set it.
    On a CPU backend `mixed_precision=True` runs every compiled module's forward pass under
    `cstorch.amp.autocast()` (bfloat16 on the CPU).
    On a GPU backend `enable_distributed=True` makes a multi-process run, launched by
    `torchrun` (`cstorch.backend.process_group`): JAX's distributed runtime joins the
    processes, the mesh spans every process's devices with the processes along its first
    axis, each step's tensor arguments are this process's part of the global batch (split
    along the first dimension, 0-d tensors equal on every process), parameters are kept
    replicated and gradients all-reduced by XLA. A step computes over the global batch and
    its returned tensors are whole on every process. `dist_backend` picks the devices and
    collectives: "nccl" for GPUs, "gloo" for CPU devices (such a run needs no GPU).
    `init_method` is the rendezvous of `torch.distributed.init_process_group` (default
    "env://"). `sync_batchnorm=True` computes batch-norm statistics over the global batch;
    by default each process's shard is normalised by its own statistics, and running
    statistics follow process 0's shard, as under DistributedDataParallel. Only the
    process `main_process_id` writes checkpoints, summaries and artifacts.
    """

    def __init__(self, backend_type: str | BackendType, *args, **kwargs):
        params = {**_positional(backend_type, args, kwargs), **kwargs} if args else kwargs
        # A `BackendType` (also a str: `backend_type == "CSX"` holds); its `.name` is what
        # Model Zoo reads.
        self.backend_type = BackendType.from_str(backend_type)
        allowed = PARAMS[self.backend_type]
        unknown = sorted(set(params) - set(allowed))
        if unknown:
            raise TypeError(
                f"{self.backend_type} backend got unexpected parameter(s) {', '.join(unknown)}; "
                f"it accepts {', '.join(sorted(allowed))}")
        values = {**allowed, **params}
        for name, value in values.items():
            if name in BOOL_PARAMS and not isinstance(value, bool):
                raise TypeError(f"{name} must be a bool, got {value!r}")
        mc = values["max_checkpoints"]
        if mc is not None and (not isinstance(mc, int) or isinstance(mc, bool) or mc < 1):
            raise ConfigurationError(f"max_checkpoints must be None or a positive int, got {mc!r}")
        if values.get("mixed_precision") not in (None, True, False):
            raise TypeError(f"mixed_precision must be a bool or None, got {values['mixed_precision']!r}")
        if not isinstance(values.get("main_process_id", 0), int):
            raise TypeError(f"main_process_id must be an int, got {values['main_process_id']!r}")
        self.params = values
        # Read on every step call: worked out once. `drops_data` says why state values are
        # not put on the device ("compile_only", "validate_only": kept on the host;
        # "drop_data": dropped); `executes` is False when steps are compiled but not run.
        self.drops_data = next((m for m in ("validate_only", "compile_only", "drop_data")
                                if values.get(m)), None)
        self.executes = not (values.get("compile_only") or values.get("validate_only"))
        inert = [k for k in DISTRIBUTED_ONLY if k in params and params[k] != allowed[k]]
        if inert and not values.get("enable_distributed"):
            warnings.warn(f"{self.backend_type} backend: {', '.join(inert)} "
                          f"{'has' if len(inert) == 1 else 'have'} no effect without "
                          f"enable_distributed=True", stacklevel=3)
        self.process_group = None
        if values.get("enable_distributed"):
            self.process_group = process_group.initialize(
                values["dist_backend"], values["init_method"], values["main_process_id"])
        self._artifact_dir = values["artifact_dir"] or os.path.join(os.getcwd(), "cerebras_logs")
        self.max_checkpoints = mc
        # The directory steps are kept in for later processes: only one the user names on a
        # CSX backend (the reference's default, /opt/cerebras/cached_compile, is a cluster
        # path). XLA's cache directory is process-wide; this is the backend's own.
        self.compile_dir = None
        if self.backend_type == "CSX" and "compile_dir" in params:
            self.compile_dir = values["compile_dir"]
            wafer.use_compile_dir(self.compile_dir)

        if self.backend_type != "GPU":
            # XLA may run the steps on the host, their buffers from malloc. Set before
            # XLA's threads start (`_devices`) so that they share glibc's one arena.
            wafer.keep_buffers_mapped()
        self.devices = self._devices()
        num_systems = 1
        if values.get("cluster_config") is not None:
            num_systems = getattr(values["cluster_config"], "num_csx", 1)
        if self.process_group is not None:
            # Data parallel between processes as between systems: state is replicated
            # along the first mesh axis and the batch split over it.
            num_systems = self.process_group.world_size
        self.mesh = wafer.make_mesh(self.devices, num_systems)
        self.state = RunState(self)
        # `cluster.config` is `cluster_config`, replaceable as Model Zoo's trainer does
        # (cstorch/backend/cluster.py).
        self._cluster = Cluster(self)
        # `with backend.device:` builds a model; on CSX with lazy_initialization its
        # tensors are created on the devices by cstorch.compile (cstorch/lazy_init/).
        self._device = Device(self)
        # Compiled modules in compile order and cstorch optimizers in creation order, held
        # weakly: a model the user drops has its state dropped (`RunState.drop_dead`).
        self.modules = WeakRegistry(self.state._owner_dropped)
        self.optimizers = WeakRegistry(self.state._owner_dropped)
        self.step_count = 0  # steps run by this backend, for per-step PRNG keys

    def _devices(self):
        if self.process_group is not None:
            return process_group.devices(self.process_group)
        if self.backend_type == "CPU":
            return jax.devices("cpu")[:1]
        if self.backend_type == "GPU":
            try:
                return jax.devices("gpu")
            except RuntimeError:
                raise RuntimeError(
                    "GPU backend requested but JAX sees no GPU; install jax with CUDA support "
                    "or use cstorch.backend(\"CPU\")") from None
        return jax.devices()

    def layout_report(self, file=None, write: bool = True) -> list:
        """Where every state tensor lives on the mesh: its partition and the bytes each
        device holds against a replicated copy. Printed to `file` (default stdout;
        `file=False` prints nothing) and, with `write`, written to `artifact_dir` as
        layout.txt and layout.json. Returns the rows."""
        self.state.sync()
        rows = wafer.layout_report(self.state.arrays(), self.mesh)
        text = wafer.format_layout(rows, self.mesh)
        if file is not False:
            print(text, file=file if file is not None else sys.stdout)
        if write and self.is_main_process:
            os.makedirs(self.artifact_dir, exist_ok=True)
            with open(os.path.join(self.artifact_dir, "layout.txt"), "w") as f:
                f.write(text + "\n")
            with open(os.path.join(self.artifact_dir, "layout.json"), "w") as f:
                json.dump(rows, f, indent=1)
        return rows

    @property
    def artifact_dir(self) -> str:
        """The directory for the artifacts this backend writes (settable: Model Zoo's
        trainer points it at its own directory)."""
        return self._artifact_dir

    @artifact_dir.setter
    def artifact_dir(self, value):
        self._artifact_dir = os.fspath(value)

    @property
    def cluster(self) -> Cluster:
        """The backend's handle on its (emulated) cluster."""
        return self._cluster

    @property
    def cluster_config(self):
        """The CSX backend's `cluster_config` (None when not given, and on CPU and GPU)."""
        return self.params.get("cluster_config")

    @property
    def device(self) -> Device:
        """The context to build a model in (`with backend.device:`)."""
        return self._device

    def to_cpu(self, tensor):
        """A copy of `tensor` (or of every tensor in a nest of containers) as an ordinary
        CPU torch tensor, its value read from the device where it lives there."""
        def one(t):
            if not isinstance(t, torch.Tensor):
                return t
            if isinstance(t, HostReads):   # a device tensor: its value read from the device
                return t.host().clone()
            return t.detach().to("cpu")
        return torch.utils._pytree.tree_map(one, tensor)

    @property
    def precision_level(self):
        """The precision optimization level steps are compiled at: the CSX flag
        `cstorch.backends.csx.precision.optimization_level`; None (exact float32) on CPU
        and GPU backends."""
        return csx.precision.optimization_level if self.is_csx else None

    @property
    def matmul_policy(self):
        """The `bridge.precision.MatmulPolicy` of `precision_level` (None: exact float32)."""
        level = self.precision_level
        if not level:
            return None
        return MatmulPolicy(**wafer.matmul_dtypes(level))

    @property
    def distributed(self) -> bool:
        """Whether this is a multi-process run (GPU backend with enable_distributed)."""
        return self.process_group is not None

    @property
    def process_count(self) -> int:
        return self.process_group.world_size if self.process_group is not None else 1

    @property
    def is_main_process(self) -> bool:
        """Whether this process writes the run's files: always, except in a multi-process
        run, where only the process `main_process_id` does."""
        return self.process_group is None or self.process_group.is_main

    @property
    def artifacts_dir(self) -> str | None:
        """Where this process writes artifacts: `artifact_dir`, or None on a process of a
        multi-process run that is not the main one."""
        return self.artifact_dir if self.is_main_process else None

    @property
    def sync_batchnorm(self) -> bool:
        return bool(self.params.get("sync_batchnorm"))

    @property
    def is_e2e_execution(self) -> bool:
        """Whether steps run end to end (not compile_only or validate_only)."""
        return self.executes

    @property
    def _impl(self) -> "Backend":
        """The backend's implementation, which is the backend itself here (Model Zoo's
        ProgressLogger reads `backend._impl.is_e2e_execution`)."""
        return self

    @property
    def is_tracing(self) -> bool:
        """Whether a `@cstorch.trace` step is being captured now (tensors are symbolic: a
        value read then must wait for a `step_closure`)."""
        return is_capturing()

    @property
    def is_csx(self) -> bool:
        return self.backend_type == "CSX"

    @property
    def is_cpu(self) -> bool:
        return self.backend_type == "CPU"

    @property
    def is_gpu(self) -> bool:
        return self.backend_type == "GPU"

    @property
    def torch_device(self) -> torch.device:
        """Tensors on the torch side stay on the CPU: the device state is JAX's."""
        return torch.device("cpu")

    @property
    def retrace_every_iteration(self) -> bool:
        return bool(self.params.get("retrace_every_iteration")) or csx.debug.retrace_every_iteration

    def __repr__(self):
        return f"Backend({self.backend_type}, devices={len(self.devices)}, mesh={dict(self.mesh.shape)})"


def backend(backend_type: str | None = None, *args, **kwargs) -> Backend:
    """Instantiate a backend of `backend_type` ("CSX", "CPU" or "GPU") and make it current.

    Without a type, return the current backend (an error if there is none). A process has
    one backend: instantiating another while one exists raises a RuntimeError (the
    models, optimizers and loaders of a run belong to its backend).
    """
    if backend_type is None:
        if args or kwargs:
            raise TypeError("backend parameters need a backend_type (\"CSX\", \"CPU\" or \"GPU\")")
        existing = current.backend()
        if existing is None:
            raise BackendError("no backend has been initialized; call cstorch.backend(\"CPU\") first")
        return existing
    return Backend(backend_type, *args, **kwargs)


def _positional(backend_type, args, kwargs) -> dict:
    """Positional backend parameters, named in the order the reference lists them."""
    kind = backend_type.upper() if isinstance(backend_type, str) else backend_type
    if kind not in PARAMS:
        raise ConfigurationError(
            f"unknown backend type {backend_type!r}; expected one of \"CSX\", \"CPU\", \"GPU\"")
    order = list(PARAMS[kind])
    if len(args) > len(order):
        raise TypeError(f"{kind} backend takes at most {len(order)} positional parameters "
                        f"({', '.join(order)}), got {len(args)}")
    named = dict(zip(order, args))
    twice = sorted(set(named) & set(kwargs))
    if twice:
        raise TypeError(f"{kind} backend got {', '.join(twice)} both by position and by keyword")
    return named


def current_backend(raise_exception: bool = True, raise_warning: bool = True) -> Backend | None:
    """DEPRECATED: use `cstorch.backend()`. The current backend, or None if there is none
    and `raise_exception` is False."""
    if raise_warning:
        warnings.warn("cstorch.current_backend() is deprecated; use cstorch.backend() instead",
                      DeprecationWarning, stacklevel=2)
    existing = current.backend()
    if existing is None and raise_exception:
        raise BackendError("no backend has been initialized; call cstorch.backend(\"CPU\") first")
    return existing


def current_or_cpu_backend() -> Backend:
    """The current backend, a CPU backend made current first if there is none (what
    `cstorch.compile`, optimizers and traced steps use without a backend)."""
    existing = current.backend()
    return existing if existing is not None else Backend("CPU")


def current_torch_device() -> torch.device:
    """The torch device of the current backend; cpu if no backend exists yet."""
    existing = current.backend()
    return existing.torch_device if existing is not None else torch.device("cpu")


def use_cs() -> bool:
    """True if the current backend is a CSX backend."""
    existing = current.backend()
    return existing is not None and existing.is_csx


__all__ = ["Backend", "BackendMeta", "BackendType", "backend", "current_backend", "current_backend_impl",
           "current_torch_device", "get_backend_args", "ltc_backend", "use_cs"]
