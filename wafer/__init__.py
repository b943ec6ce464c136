"""The emulated wafer on jax.sharding: meshes, layouts and compilation. Knows only jax."""
from wafer.compile import CompiledStep, compile_step, write_artifacts
from wafer.layout import batch_sharding, replicated, state_sharding
from wafer.mesh import AXES, make_mesh

__all__ = ["AXES", "make_mesh", "replicated", "batch_sharding", "state_sharding", "compile_step", "CompiledStep",
           "write_artifacts"]
