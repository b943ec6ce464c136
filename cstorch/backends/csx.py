"""`cerebras.pytorch.backends.csx`: flags of the CSX backend, in groups: `precision`,
`performance`, `debug`, `cluster` and `storage.s3`.

Flags are validated on assignment, so a bad value fails where it is set. A flag that has
nothing to act on here (cluster plumbing) is stored only, and setting it to other than its
default warns that it has no effect.
"""
import copy
import warnings
from typing import Any
from collections.abc import Callable

from cstorch.backends.debug_args import DebugArgs, update_from_keys


class _FlagGroup:
    """Attributes with defaults and validators; unknown names are refused. Flags in
    `_inert` are accepted but act on nothing here, so setting one to another value than
    its default warns. Each group starts from (and `reset()` returns to) fresh copies of
    the defaults, so a mutable default (a `DebugArgs`) is never shared."""

    _flags: dict[str, tuple[Any, Any]] = {}
    _inert: dict[str, str] = {}
    _honoured: dict[str, tuple] = {}   # values of an inert flag that are what happens anyway
    _convert: dict[str, Callable[[Any], Any]] = {}   # how a checked value is stored
    _path = None   # the group's dotted name under cstorch.backends.csx (default: class name)

    def __init__(self):
        self.reset()

    @property
    def _name(self) -> str:
        return self._path or type(self).__name__.lower()

    def __setattr__(self, name, value):
        if name not in self._flags:
            raise AttributeError(
                f"{self._name} has no flag {name!r}; "
                f"known flags: {', '.join(sorted(self._flags))}")
        default, check = self._flags[name]
        if check is not None:
            check(name, value)
        if name in self._convert:
            value = self._convert[name](value)
        if name in self._inert and value != default and value not in self._honoured.get(name, ()):
            warnings.warn(f"cstorch.backends.csx.{self._name}.{name} has no effect "
                          f"here: {self._inert[name]}", stacklevel=2)
        object.__setattr__(self, name, value)

    def reset(self):
        for name, (default, _) in self._flags.items():
            value = copy.deepcopy(default)
            if name in self._convert:
                value = self._convert[name](value)
            object.__setattr__(self, name, value)

    def __repr__(self):
        return f"{type(self).__name__}({', '.join(f'{k}={getattr(self, k)!r}' for k in self._flags)})"


def _optional_positive_int(name, value):
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
        raise ValueError(f"{name} must be None or a positive int, got {value!r}")


def _positive_int(name, value):
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def _bool(name, value):
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r}")


def _optional_bool(name, value):
    if value is not None:
        _bool(name, value)


def _optimization_level(name, value):
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 3:
        raise ValueError(f"{name} must be an integer in range [0, 3), got {value!r}")


def _optional_positive_number(name, value):
    if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)
                              or not value > 0):
        raise ValueError(f"{name} must be None or a positive number, got {value!r}")


def _micro_batch_size(name, value, per_step=True):
    if value is None or value in ("auto", "explore"):
        return
    if isinstance(value, int) and not isinstance(value, bool):
        if value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value}")
        return
    if isinstance(value, dict) and set(value) == {"explore"} and isinstance(value["explore"], dict):
        bounds = value["explore"]
        unknown = set(bounds) - {"min", "max"}
        if unknown:
            raise ValueError(f"{name}['explore'] takes only 'min' and 'max', got {sorted(unknown)}")
        for key in ("min", "max"):
            _optional_positive_int(f"{name}['explore']['{key}']", bounds.get(key))
        if bounds.get("min") and bounds.get("max") and bounds["min"] > bounds["max"]:
            raise ValueError(f"{name}['explore']: min {bounds['min']} exceeds max {bounds['max']}")
        return
    if per_step and isinstance(value, dict) and value and "explore" not in value \
            and all(isinstance(k, str) for k in value):
        for step, v in value.items():
            _micro_batch_size(f"{name}[{step!r}]", v, per_step=False)
        return
    raise ValueError(
        f"{name} must be None, 'auto', 'explore', a positive int, "
        f"{{'explore': {{'min': int, 'max': int}}}}, or a dict of those keyed by traced step "
        f"function name, got {value!r}")


def _optional_str(name, value):
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{name} must be None or a str, got {value!r}")


def _optional_str_list(name, value):
    if value is not None and (not isinstance(value, (list, tuple))
                              or not all(isinstance(v, str) for v in value)):
        raise TypeError(f"{name} must be None or a list of str, got {value!r}")


def _debug_args(name, value):
    if value is not None and not isinstance(value, (DebugArgs, dict)):
        raise TypeError(f"{name} must be a DebugArgs (cerebras.appliance.utils.debug_args."
                        f"get_debug_args() reads one from a file), a dict of dotted field "
                        f"paths to values, or None, got {type(value).__name__}")


class _FlagDebugArgs(DebugArgs):
    """The `debug.debug_args` flag's own copy of the settings: merging non-empty settings
    into it warns, as setting the flag does, since nothing here acts on them."""

    @classmethod
    def copy_of(cls, value):
        """The flag's value for what was assigned: a copy of a `DebugArgs`; a dict of
        dotted field paths (`{"debug_usr.flag": True}`, as a Model Zoo config gives it)
        set one by one; None: empty."""
        flag = cls()
        if isinstance(value, dict):
            update_from_keys(flag, value)
        elif value is not None:
            DebugArgs.MergeFrom(flag, value)
        return flag

    def MergeFrom(self, other) -> None:  # noqa: N802 (protocol buffer spelling)
        super().MergeFrom(other)
        if self:
            warnings.warn(f"cstorch.backends.csx.debug.debug_args has no effect here: "
                          f"{Debug._inert['debug_args']}", stacklevel=2)


class Precision(_FlagGroup):
    """Precision flags. `optimization_level` (POL, an int in [0, 3), default 1) selects how
    much reduced precision steps on a CSX backend compute in (`wafer.precision` has the
    table): 0 is float32 throughout, 1 rounds matmul and convolution operands to bfloat16
    with float32 results, 2 also rounds their results to bfloat16. Weights, optimizer
    state and reductions stay float32 at every level."""
    _flags = {"optimization_level": (1, _optimization_level)}


class Performance(_FlagGroup):
    """Performance flags.

    - `micro_batch_size` (CSX only; `docs/micro-batching.md`): a positive int cuts each
      batch into micro-batches of that size, run in one loop on the device with the
      gradients combined before the optimizer runs once; None runs batches whole; "auto"
      (default) picks the largest size whose program fits the memory budget (the whole
      batch when it fits); "explore" or {"explore": {"min": int, "max": int}} compiles
      and times every size, prints a table and trains nothing; a dict keyed by traced step
      function name ({"training_step": 4, "eval_step": None}) gives each step its own
      value, "auto" for steps it does not name.
    - `transfer_processes`: processes that move data to and from the device (default 5).
    - `compress_weights` (default False): recorded as `compressed: true` on the tensors
      `cstorch.save` writes; every non-scalar tensor goes through LZ4 whatever it says.
    - `scan_blocks` (default False; every backend): True makes structurally identical
      modules applied one after another (the layers of an `nn.ModuleList` or
      `nn.Sequential`) compile as one loop over their stacked weights (`jax.lax.scan`),
      forward and gradients, instead of once per layer; the program computes what the
      unrolled one does. Layers that differ are unrolled and the reason logged at INFO
      (logger `bridge.scan`); not applied to micro-batched steps (`docs/scan-blocks.md`).
      On one device the layers' parameters, their optimizer state and their gradients
      are held stacked, so a deep model's first step compiles in about the same time
      whatever its depth. Off by default: on the CPU backend the looped steps themselves
      ran slower than the unrolled ones, and below some 20 layers the loop also compiled
      slower (`docs/benchmarks.md`, "State held stacked").
    - `scan_blocks_remat` (default False; with `scan_blocks`): True makes the loop over the
      layers' gradients compute each layer's forward ops again (activation
      rematerialisation, as `jax.checkpoint` would) instead of reading every layer's
      activations stacked by the forward loop: the forward keeps only each layer's input,
      trading one more forward pass of the layers for their activations' memory. Results
      are the same, dropout masks included. Part of the program key; set while
      `scan_blocks` is off (or where the layers cannot loop) it warns at the capture that
      it has no effect.
    - `trace_blocks_once` (default True; every backend): the capture traces the first of
      structurally identical modules applied one after another and gives the others
      copies of its ops, forward and gradients, so a deep model's capture takes about as
      long as a shallow one's; the program is the one tracing every layer gives. Layers
      that cannot be copied (called with other arguments, or whose ops reach outside the
      layer) are traced one by one, the reason logged at INFO (logger `cstorch`). The same
      holds for an optimizer's update: traced for the first of each kind of alike
      parameters (same shapes and state) and copied for the others, with the same
      values. False traces every layer and every update. Part of the program key
      (`docs/scan-blocks.md`).
    """
    _flags = {
        "micro_batch_size": ("auto", _micro_batch_size),
        "transfer_processes": (5, _positive_int),
        "compress_weights": (False, _bool),
        "scan_blocks": (False, _bool),
        "scan_blocks_remat": (False, _bool),
        "trace_blocks_once": (True, _bool),
    }
    _inert = {"transfer_processes": "data moves to the devices in this process"}


class Debug(_FlagGroup):
    """Debug flags.

    - `retrace_every_iteration` (default False): capture the step again on every call,
      and log what changed when its graph differs from the last one.
    - `check_indices` (default None: on for CPU and GPU backends, off on CSX, as on the
      wafer): the compiled step also computes the range of every index argument (class
      targets, embedding ids, gather and scatter indices, indexing), and an index out of
      range raises an `IndexError` naming the op and the line of model code, as eager
      PyTorch would (`cstorch.tracing.index_check`). True or False sets it on every
      backend.
    - `check_finite` (default False; every backend, not only CSX): after each step, raise
      a `FloatingPointError` naming the first ATen op, with the line of model code that made
      it, whose result has a NaN or Inf. Costs a check per op; for debugging.
    - `lazy_initialization` (default True): tensors created inside `with backend.device:`
      on a CSX backend hold no host data; `cstorch.compile` builds them on the devices
      (`cstorch.lazy_init`; random initialisation then draws from JAX's PRNG). False
      creates them eagerly on the host, with eager PyTorch's values.
    - `debug_args` (default an empty `DebugArgs`): the cluster's compiler and runtime
      debug settings, stored only. Assigning a `DebugArgs`, or a dict of dotted field
      paths to values (None: empty), stores a copy;
      `debug.debug_args.MergeFrom(other)` merges into it, as Model Zoo's `DebugArgsPath`
      callback does. Both warn when the settings end up non-empty.
    - `ini` (default None): cluster INI switches; stored only.
    - `fabric_type_blacklist` (default None): a list of system fabric types a cluster job
      must not be scheduled on; stored only.
    - `act_memory_gi` (default None): the activation memory budget per device, in GiB (a
      fraction is accepted), that `micro_batch_size="auto"` fits XLA's scratch memory into;
      without it "auto" fits the whole step into the device's memory.
    - `compile_crd_memory_gi`, `execute_crd_memory_gi`, `wrk_memory_gi`, `cmd_memory_gi`,
      `wgt_memory_gi` (default None): memory limits of the cluster's other roles in GiB;
      stored only, as there is no cluster here.
    Setting a stored-only flag to other than its default warns that it has no effect.
    """
    _flags = {
        "retrace_every_iteration": (False, _bool),
        "check_finite": (False, _bool),
        "check_indices": (None, _optional_bool),
        "lazy_initialization": (True, _bool),
        "debug_args": (DebugArgs(), _debug_args),
        "ini": (None, None),
        "fabric_type_blacklist": (None, _optional_str_list),
        **{f"{role}_memory_gi": (None, _optional_positive_number)
           for role in ("compile_crd", "execute_crd", "wrk", "act", "cmd", "wgt")},
    }
    _inert = {
        "debug_args": "there is no cluster to pass them to",
        "ini": "there is no cluster to pass them to",
        "fabric_type_blacklist": "there is no cluster whose systems it excludes",
        **{f"{role}_memory_gi": "there is no cluster whose memory it limits"
           for role in ("compile_crd", "execute_crd", "wrk", "cmd", "wgt")},
    }
    _convert = {"debug_args": lambda value: _FlagDebugArgs.copy_of(value)}


class Cluster(_FlagGroup):
    """Cluster flags. `auto_taint` (default False): on a Wafer-Scale Cluster, mark a
    system that failed a job as unschedulable so a restarted job avoids it (Model Zoo's
    restartable trainer sets it). There is no cluster here: stored only, and setting it
    to True warns that it has no effect."""
    _flags = {"auto_taint": (False, _bool)}
    _inert = {"auto_taint": "there is no cluster whose systems it marks"}


class S3(_FlagGroup):
    """S3 storage flags. `profile` (default None): the AWS credentials profile used for
    `s3://` checkpoint paths. S3 paths are refused here (`cerebras.appliance.storage`
    reads and writes local paths only), so it is stored only and setting it warns."""
    _flags = {"profile": (None, _optional_str)}
    _inert = {"profile": "s3:// checkpoint paths are not supported here; only local paths are"}
    _path = "storage.s3"


class Storage(_FlagGroup):
    """Checkpoint storage flags: `storage.s3` (`S3`). It has no flags of its own."""
    _flags = {}

    def __init__(self):
        object.__setattr__(self, "s3", S3())

    def reset(self):
        self.s3.reset()

    def __repr__(self):
        return f"Storage(s3={self.s3!r})"


precision = Precision()
performance = Performance()
debug = Debug()
cluster = Cluster()
storage = Storage()
