"""Mixed precision: the run's half dtype and floating point dtype, autocast and loss
scaling."""
from cstorch.amp.autocast import autocast
from cstorch.amp.grad_scaler import GradScaler, optimizer_step
from cstorch.amp.half_dtype import (enable_mixed_precision, get_floating_point_dtype,
                                    get_floating_point_dtype_str, get_half_dtype,
                                    get_half_dtype_str, init, is_cbfloat16_tensor,
                                    mixed_precision,
                                    set_half_dtype)

__all__ = [
    "set_half_dtype", "get_half_dtype", "get_half_dtype_str", "enable_mixed_precision",
    "mixed_precision", "get_floating_point_dtype", "get_floating_point_dtype_str",
    "is_cbfloat16_tensor", "init", "autocast", "GradScaler", "optimizer_step",
]
