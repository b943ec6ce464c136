"""The dtypes matrix products and convolutions compute in, while a step is lowered.

Lowerings of matmuls and convolutions call `dot`/`conv` here instead of jax directly, so
one policy, set by whoever lowers the step, decides their precision:

- `operands`: the dtype float32 operands are rounded to before the product (None: kept);
- `result`: the dtype the product is rounded to (None: float32, accumulated in float32).

Other dtypes (float64, float16, bfloat16 models, integers) are left alone: a policy only
trades float32 precision away. With no policy set, products are exact float32, as eager
PyTorch computes them on the CPU.
"""
import contextlib
import contextvars
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

_HIGHEST = jax.lax.Precision.HIGHEST


@dataclass(frozen=True)
class MatmulPolicy:
    operands: Any | None = None
    result: Any | None = None


_policy: contextvars.ContextVar[MatmulPolicy | None] = contextvars.ContextVar(
    "bridge_matmul_policy", default=None)


@contextlib.contextmanager
def matmul_policy(policy: MatmulPolicy | None):
    """Lower matmuls and convolutions under `policy` while inside."""
    token = _policy.set(policy)
    try:
        yield
    finally:
        _policy.reset(token)


def _apply(fn, a, b, **kwargs):
    policy = _policy.get()
    if policy is None or a.dtype != jnp.float32 or b.dtype != jnp.float32:
        return fn(a, b, precision=_HIGHEST, **kwargs)
    if policy.operands is not None:
        a, b = a.astype(policy.operands), b.astype(policy.operands)
    out = fn(a, b, precision=_HIGHEST, preferred_element_type=jnp.float32, **kwargs)
    if policy.result is not None:
        out = out.astype(policy.result)
    return out.astype(jnp.float32)


HALF = (jnp.bfloat16, jnp.float16)


def is_half(*arrays) -> bool:
    return all(x.dtype in HALF for x in arrays)


def dot_float32(a, b):
    """The product of half-precision `a` and `b`, accumulated in float32 and left there
    unrounded: for lowerings that add a bias before their one rounding to the half dtype,
    as PyTorch's half-precision GEMM and convolution do (rounding the product first and the
    sum again differs from them in the last bit of about a quarter of the elements)."""
    return jnp.matmul(a, b, precision=_HIGHEST, preferred_element_type=jnp.float32)


def conv_float32(x, w, **kwargs):
    """`conv_general_dilated` of half-precision operands, as `dot_float32`."""
    return jax.lax.conv_general_dilated(x, w, precision=_HIGHEST,
                                        preferred_element_type=jnp.float32, **kwargs)


def dot(a, b):
    """`jnp.matmul(a, b)` under the current policy."""
    return _apply(jnp.matmul, a, b)


def einsum(spec: str, a, b):
    """A two-operand `jnp.einsum` under the current policy."""
    return _apply(lambda x, y, **kw: jnp.einsum(spec, x, y, **kw), a, b)


def conv(x, w, **kwargs):
    """`jax.lax.conv_general_dilated(x, w, ...)` under the current policy."""
    return _apply(jax.lax.conv_general_dilated, x, w, **kwargs)
