"""`cstorch.utils.CSConfig`: the configuration of a Wafer-Scale Cluster run.

Here a cluster is emulated on JAX devices: `num_csx` is the number of systems the
backend's mesh is split into (the "systems" axis) and `num_workers_per_csx` the number of
streaming workers that build a dataloader for each system. The other fields are validated
and kept for scripts that set them; as there is no appliance to talk to, setting one to
other than its default warns that it has no effect.

`cstorch.distributed.ClusterConfig` (what Model Zoo builds) is this class with the extra
fields of a newer cluster client; a CSX backend's `cluster_config` takes either. Both hash
by value, so a backend's arguments can key a cache (Model Zoo's trainer does).
"""
import warnings
from dataclasses import dataclass, fields

_EMULATED = {"num_csx", "num_workers_per_csx"}


@dataclass
class CSConfig:
    mgmt_address: str | None = None
    credentials_path: str | None = None
    num_csx: int = 1
    max_wgt_servers: int = 24
    max_act_per_csx: int = 1
    num_workers_per_csx: int = 1
    transfer_processes: int = 5
    job_time_sec: int | None = None
    mount_dirs: list[str] | None = None
    python_paths: list[str] | None = None
    job_labels: list[str] | None = None
    debug_args: object = None
    precision_opt_level: int = 1

    def __post_init__(self):
        for name in ("num_csx", "max_wgt_servers", "max_act_per_csx", "num_workers_per_csx",
                     "transfer_processes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"CSConfig.{name} must be a positive int, got {value!r}")
        if self.precision_opt_level not in (0, 1, 2):
            raise ValueError(f"CSConfig.precision_opt_level must be 0, 1 or 2, got "
                             f"{self.precision_opt_level!r}")
        for label in self.job_labels or []:
            if "=" not in label:
                raise ValueError(f"CSConfig.job_labels entries are key=value pairs, got {label!r}")
        unused = [f.name for f in fields(self)
                  if f.name not in _EMULATED and getattr(self, f.name) != f.default]
        if unused:
            warnings.warn(f"{type(self).__name__} {', '.join(unused)} "
                          f"{'has' if len(unused) == 1 else 'have'} no effect here: the cluster "
                          f"is emulated on JAX devices, and only num_csx and num_workers_per_csx "
                          f"shape it", stacklevel=self._warn_stacklevel)

    _warn_stacklevel = 3   # the caller of the dataclass __init__

    def __hash__(self):
        return _hash_fields(self)


def _frozen(value):
    """A hashable stand-in for a field's value: lists and dicts by their contents."""
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((str(k), _frozen(v)) for k, v in value.items()))
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):   # DebugArgs
        return _frozen(to_dict())
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value


def _hash_fields(config) -> int:
    """Hash a (mutable) config dataclass by its fields' values, consistently with `==`."""
    return hash((type(config), tuple((f.name, _frozen(getattr(config, f.name)))
                                     for f in fields(config))))
