"""`cerebras.pytorch.experimental`: features whose API may still change."""
from cstorch.experimental import listener
from cstorch.experimental.compression import Compression
from cstorch.experimental.implicit_loop import (get_loop_iteration_slice, start_implicit_loop,
                                                update_implicit_loop)
from cstorch.experimental.listener import register_traced_tensor_hook

__all__ = ["listener", "Compression", "start_implicit_loop", "update_implicit_loop",
           "get_loop_iteration_slice", "register_traced_tensor_hook"]
