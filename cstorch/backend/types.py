"""`BackendType`, the three kinds of backend, and `get_backend_args`, the parameters each
takes."""
from enum import Enum
from typing import Any, Union


# The parameters of each backend type besides the type, in the order `cstorch.backend`
# takes them positionally, with their defaults.
PARAMS = {
    "CSX": {"artifact_dir": None, "compile_dir": "/opt/cerebras/cached_compile",
            "compile_only": False, "validate_only": False, "drop_data": False,
            "max_checkpoints": None, "log_initialization": True, "retrace_every_iteration": False,
            "cluster_config": None},
    "CPU": {"artifact_dir": None, "max_checkpoints": None, "mixed_precision": None},
    "GPU": {"artifact_dir": None, "enable_distributed": False, "main_process_id": 0,
            "dist_backend": "nccl", "init_method": None, "sync_batchnorm": False,
            "max_checkpoints": None},
}
BOOL_PARAMS = {"compile_only", "validate_only", "drop_data", "log_initialization",
               "retrace_every_iteration", "enable_distributed", "sync_batchnorm"}

# GPU parameters that only a multi-process run reads: set without enable_distributed, warn.
DISTRIBUTED_ONLY = ("main_process_id", "dist_backend", "init_method", "sync_batchnorm")


class BackendType(str, Enum):
    """The type of a backend: "CSX" (an emulated wafer over every JAX device), "CPU" or
    "GPU". A member is also its name as a str (`BackendType.CSX == "CSX"`), so code that
    compares or formats `backend.backend_type` as a string keeps working."""
    CSX = "CSX"
    CPU = "CPU"
    GPU = "GPU"

    def __str__(self):
        return self.value

    def __format__(self, spec):
        return format(self.value, spec)

    @staticmethod
    def from_str(backend_type: Union[str, "BackendType"]) -> "BackendType":
        """The type named `backend_type`, in any case ("csx", "CPU", ...)."""
        if isinstance(backend_type, BackendType):
            return backend_type
        if isinstance(backend_type, str):
            try:
                return BackendType[backend_type.upper()]
            except KeyError:
                pass
        raise ValueError(f"unknown backend type {backend_type!r}; expected one of \"CSX\", "
                         f"\"CPU\", \"GPU\"")

    @property
    def is_csx(self) -> bool:
        return self is BackendType.CSX

    @property
    def is_cpu(self) -> bool:
        return self is BackendType.CPU

    @property
    def is_gpu(self) -> bool:
        return self is BackendType.GPU


def get_backend_args(backend_type: str | BackendType) -> dict[str, Any]:
    """The parameters a backend of `backend_type` takes besides its type, in the order
    `cstorch.backend` takes them positionally, each with its default:
    `get_backend_args("CPU") == {"artifact_dir": None, "max_checkpoints": None,
    "mixed_precision": None}`. Model Zoo picks a backend's arguments out of its
    configuration with it. A new dict each call."""
    return dict(PARAMS[BackendType.from_str(backend_type).value])


__all__ = ["BackendType", "get_backend_args"]
