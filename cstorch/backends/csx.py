"""`cerebras.pytorch.backends.csx`: performance and debug flags of the CSX backend.

Flags are validated on assignment, so a bad value fails where it is set.
"""
import warnings
from typing import Any


class _FlagGroup:
    """Attributes with defaults and validators; unknown names are refused. Flags in
    `_inert` are accepted but act on nothing here, so setting one to another value than
    its default warns."""

    _flags: dict[str, tuple[Any, Any]] = {}
    _inert: dict[str, str] = {}
    _honoured: dict[str, tuple] = {}   # values of an inert flag that are what happens anyway

    def __init__(self):
        for name, (default, _) in self._flags.items():
            object.__setattr__(self, name, default)

    def __setattr__(self, name, value):
        if name not in self._flags:
            raise AttributeError(
                f"{type(self).__name__.lower()} has no flag {name!r}; "
                f"known flags: {', '.join(sorted(self._flags))}")
        default, check = self._flags[name]
        if check is not None:
            check(name, value)
        if name in self._inert and value != default and value not in self._honoured.get(name, ()):
            warnings.warn(f"cstorch.backends.csx.{type(self).__name__.lower()}.{name} has no effect "
                          f"here: {self._inert[name]}", stacklevel=2)
        object.__setattr__(self, name, value)

    def reset(self):
        for name, (default, _) in self._flags.items():
            object.__setattr__(self, name, default)

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
    - `compress_weights`: write checkpoints with LZ4 compression (default False).
    """
    _flags = {
        "micro_batch_size": ("auto", _micro_batch_size),
        "transfer_processes": (5, _positive_int),
        "compress_weights": (False, _bool),
    }
    _inert = {"transfer_processes": "data moves to the devices in this process"}


class Debug(_FlagGroup):
    """Debug flags.

    - `retrace_every_iteration` (default False): capture the step again on every call,
      and log what changed when its graph differs from the last one.
    - `check_finite` (default False; every backend, not only CSX): after each step, raise
      a `FloatingPointError` naming the first ATen op, with the line of model code that made
      it, whose result has a NaN or Inf. Costs a check per op; for debugging.
    - `lazy_initialization` (default True): tensors created inside `with backend.device:`
      on a CSX backend hold no host data; `cstorch.compile` builds them on the devices
      (`cstorch.lazy_init`; random initialisation then draws from JAX's PRNG). False
      creates them eagerly on the host, with eager PyTorch's values.
    - `debug_args`, `ini` (default None): cluster debugging options; stored only.
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
        "lazy_initialization": (True, _bool),
        "debug_args": (None, None),
        "ini": (None, None),
        **{f"{role}_memory_gi": (None, _optional_positive_number)
           for role in ("compile_crd", "execute_crd", "wrk", "act", "cmd", "wgt")},
    }
    _inert = {
        "debug_args": "there is no cluster to pass them to",
        "ini": "there is no cluster to pass them to",
        **{f"{role}_memory_gi": "there is no cluster whose memory it limits"
           for role in ("compile_crd", "execute_crd", "wrk", "cmd", "wgt")},
    }


precision = Precision()
performance = Performance()
debug = Debug()
