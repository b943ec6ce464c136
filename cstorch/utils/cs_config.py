"""`cstorch.utils.CSConfig`: the configuration of a Wafer-Scale Cluster run.

Here a cluster is emulated on JAX devices: `num_csx` is the number of systems the
backend's mesh is split into (the "systems" axis); the other fields are validated and
kept for scripts that set them, without effect, as there is no appliance to talk to.
"""
from dataclasses import dataclass
from typing import List, Optional


@dataclass
class CSConfig:
    mgmt_address: Optional[str] = None
    credentials_path: Optional[str] = None
    num_csx: int = 1
    max_wgt_servers: int = 24
    max_act_per_csx: int = 1
    num_workers_per_csx: int = 1
    transfer_processes: int = 5
    job_time_sec: Optional[int] = None
    mount_dirs: Optional[List[str]] = None
    python_paths: Optional[List[str]] = None
    job_labels: Optional[List[str]] = None
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
        for name in ("job_labels",):
            for label in getattr(self, name) or []:
                if "=" not in label:
                    raise ValueError(f"CSConfig.job_labels entries are key=value pairs, got {label!r}")
