"""The emulated wafer on jax.sharding: meshes, layouts and compilation. Knows only jax."""
from wafer.cache import CompileStats, compile_dir, stats as compile_stats, use_compile_dir
from wafer.compile import CompiledStep, compile_step, write_artifacts
from wafer.host_memory import keep_buffers_mapped
from wafer.layout import batch_sharding, format_layout, layout_report, replicated, state_sharding
from wafer.mesh import AXES, box_mesh, make_mesh
from wafer.precision import matmul_dtypes
from wafer import artifact_writer, micro_batch, stored
from wafer.micro_batch import run_micro_batches

__all__ = ["AXES", "make_mesh", "box_mesh", "replicated", "batch_sharding", "state_sharding",
           "compile_step", "CompiledStep",
           "write_artifacts", "use_compile_dir", "compile_dir", "compile_stats", "CompileStats",
           "artifact_writer", "micro_batch", "stored",
           "run_micro_batches", "matmul_dtypes", "layout_report", "format_layout", "keep_buffers_mapped"]
