"""ATen's CPU kernels compute 16-bit floats in float32 (their "opmath" type) and round the
result once; the same op written directly on float16 or bfloat16 in XLA rounds every
intermediate step, and differs in many elements."""
import jax.numpy as jnp

HALF = (jnp.float16, jnp.bfloat16)


def in_float32(fn, *args, out_dtype=None):
    """`fn(*args)`, computed in float32 where the first argument is a 16-bit float and
    rounded once to `out_dtype` (default: that argument's dtype)."""
    if args[0].dtype not in HALF:
        return fn(*args)
    out_dtype = args[0].dtype if out_dtype is None else out_dtype
    return fn(*(a.astype(jnp.float32) for a in args)).astype(out_dtype)
