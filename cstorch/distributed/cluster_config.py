"""`cstorch.distributed.ClusterConfig`: how a CSX run is laid out on a Wafer-Scale Cluster.

It is `cstorch.utils.CSConfig` (same fields, same validation, same meaning here) with the
fields of the newer cluster client that Model Zoo passes: `mgmt_namespace`,
`cbcore_image`, `job_priority` and `disable_version_check`. On the emulated cluster only
`num_csx` (the systems the backend's mesh is split into) and `num_workers_per_csx` (the
streaming workers per system) act; the others are plumbing for a cluster that does not
exist, kept and validated, and setting one to other than its default warns.
"""
from dataclasses import dataclass, fields

from cstorch.utils.cs_config import CSConfig, _hash_fields

_PRIORITIES = ("p1", "p2", "p3")


@dataclass(eq=True)
class ClusterConfig(CSConfig):
    """A CSX backend's `cluster_config` (`cstorch.backend("CSX", cluster_config=...)`).

    Every field may also be given as None, which means its default: Model Zoo fills the
    config from its run configuration with `runconfig.get(...)`, so unset keys arrive as
    None (`num_csx=None` is one system).

    - `num_csx`: systems the run is spread over (the mesh's "systems" axis).
    - `num_workers_per_csx`: streaming workers that build a dataloader for each system.
    - `mgmt_address`, `mgmt_namespace`, `credentials_path`, `cbcore_image`, `job_labels`,
      `job_priority` ("p1", "p2" or "p3"), `job_time_sec`, `mount_dirs`, `python_paths`,
      `max_wgt_servers`, `max_act_per_csx`, `transfer_processes`, `disable_version_check`,
      `debug_args`, `precision_opt_level`: cluster plumbing, no effect here.
    The config stays mutable (Model Zoo sets `max_act_per_csx` and `job_priority` after
    creating it) and hashes by value.
    """
    mgmt_namespace: str | None = None
    cbcore_image: str | None = None
    job_priority: str | None = None
    disable_version_check: bool = False

    _warn_stacklevel = 4   # through this __post_init__ to the caller of __init__

    def __post_init__(self):
        for f in fields(self):
            if getattr(self, f.name) is None and f.default is not None:
                object.__setattr__(self, f.name, f.default)
        if self.job_priority is not None and self.job_priority not in _PRIORITIES:
            raise ValueError(f"ClusterConfig.job_priority must be one of "
                             f"{', '.join(_PRIORITIES)} or None, got {self.job_priority!r}")
        if not isinstance(self.disable_version_check, bool):
            raise TypeError(f"ClusterConfig.disable_version_check must be a bool, got "
                            f"{self.disable_version_check!r}")
        super().__post_init__()

    def __hash__(self):
        return _hash_fields(self)


__all__ = ["ClusterConfig"]
