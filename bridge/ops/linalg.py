"""Matrix products."""
import jax.numpy as jnp
import torch

from bridge import precision
from bridge.ops.registry import lowering

aten = torch.ops.aten


def _matmul(a, b):
    return precision.dot(a, b)


@lowering(aten.mm.default, aten.bmm.default, aten.matmul.default)
def mm(a, b):
    return _matmul(a, b)


@lowering(aten.addmm.default, aten.baddbmm.default)
def addmm(bias, a, b, beta=1, alpha=1):
    # half precision: the bias joins the float32 accumulator, one rounding, as in PyTorch
    half = precision.is_half(a, b)
    out = precision.dot_float32(a, b) if half else _matmul(a, b)
    if alpha != 1:
        out = out * alpha
    if beta != 0:
        out = out + (bias if beta == 1 else beta * bias)
    return out.astype(a.dtype) if half else out


@lowering(aten.addbmm.default)
def addbmm(bias, a, b, beta=1, alpha=1):
    # the batch of products is summed into one matrix
    return addmm(bias, jnp.concatenate(list(a), axis=-1) if a.shape[0] else
                 jnp.zeros(a.shape[1:2] + (0,), a.dtype),
                 jnp.concatenate(list(b), axis=0) if b.shape[0] else
                 jnp.zeros((0,) + b.shape[2:], b.dtype), beta, alpha)


@lowering(aten.mv.default)
def mv(a, v):
    return _matmul(a, v)


@lowering(aten.dot.default, aten.vdot.default)
def dot(a, b):
    return precision.dot(a, b)


@lowering(aten.outer.default)
def outer(a, b):
    return jnp.outer(a, b)
