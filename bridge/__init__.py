"""PyTorch -> JAX: capture a PyTorch step as a functional ATen graph, lower it to JAX.

`bridge` knows torch and jax only; it knows nothing of cstorch or the emulated wafer.
"""
from bridge.capture import CaptureStats, capture, capture_stats, decompositions
from bridge.convert import (jax_to_tensor, numpy_to_tensor, tensor_to_input, tensor_to_jax,
                            tensor_to_numpy, tensors_to_jax, to_jax_dtype, to_torch_dtype)
from bridge.device_tensor import Absent, Cell, DeviceTensor
from bridge.errors import DynamicShapeError, LoweringError, MicroBatchError, TensorValueReadError
from bridge.export import to_jax
from bridge.lower import check_lowerable, lower, missing_lowerings
from bridge.ops import LOWERINGS, lowering
from bridge.ops.sharding import MESH_LAYOUT, box_meshes
from bridge.read_order import read_after_update, untouched_inputs

__all__ = [
    "capture", "capture_stats", "CaptureStats", "decompositions", "lower", "check_lowerable",
    "missing_lowerings", "read_after_update", "untouched_inputs", "LOWERINGS",
    "lowering", "LoweringError", "TensorValueReadError", "tensor_to_jax", "tensors_to_jax",
    "tensor_to_numpy",
    "jax_to_tensor", "numpy_to_tensor", "tensor_to_input", "Absent", "Cell", "DeviceTensor",
    "to_jax_dtype", "to_torch_dtype", "to_jax", "DynamicShapeError", "MicroBatchError",
    "box_meshes", "MESH_LAYOUT",
]
