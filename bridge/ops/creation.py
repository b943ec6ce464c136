"""Tensor factories: constants, ranges and uninitialised buffers."""
import jax.numpy as jnp
import torch

from bridge.convert import to_jax_dtype
from bridge.ops.registry import lowering

aten = torch.ops.aten


def _dtype(dtype, fill=None, like=None):
    if dtype is not None:
        return to_jax_dtype(dtype)
    if like is not None:
        return like.dtype
    if isinstance(fill, bool):
        return jnp.bool_
    if isinstance(fill, int):
        return to_jax_dtype(torch.int64)
    return to_jax_dtype(torch.get_default_dtype())


@lowering(aten.full.default)
def full(size, fill_value, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.full(tuple(size), fill_value, _dtype(dtype, fill_value))


@lowering(aten.full_like.default)
def full_like(x, fill_value, dtype=None, layout=None, device=None, pin_memory=None,
              memory_format=None):
    return jnp.full(x.shape, fill_value, _dtype(dtype, like=x))


@lowering(aten.scalar_tensor.default)
def scalar_tensor(value, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.asarray(value, _dtype(dtype, value if dtype else 0.0))


@lowering(aten.zeros.default, aten.empty.memory_format)
def zeros(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.zeros(tuple(size), _dtype(dtype))


@lowering(aten.ones.default)
def ones(size, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.ones(tuple(size), _dtype(dtype))


@lowering(aten.empty_strided.default)
def empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(tuple(size), _dtype(dtype))


@lowering(aten.empty_permuted.default)
def empty_permuted(size, physical_layout, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(tuple(size), _dtype(dtype))


@lowering(aten.zeros_like.default, aten.empty_like.default)
def zeros_like(x, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.zeros(x.shape, _dtype(dtype, like=x))


@lowering(aten.ones_like.default)
def ones_like(x, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.ones(x.shape, _dtype(dtype, like=x))


@lowering(aten.new_zeros.default, aten.new_empty.default)
def new_zeros(x, size, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(tuple(size), _dtype(dtype, like=x))


@lowering(aten.new_ones.default)
def new_ones(x, size, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.ones(tuple(size), _dtype(dtype, like=x))


@lowering(aten.new_full.default)
def new_full(x, size, fill_value, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.full(tuple(size), fill_value, _dtype(dtype, like=x))


@lowering(aten.new_empty_strided.default)
def new_empty_strided(x, size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(tuple(size), _dtype(dtype, like=x))


def _arange_dtype(dtype, *values):
    if dtype is not None:
        return to_jax_dtype(dtype)
    if all(isinstance(v, int) for v in values):
        return to_jax_dtype(torch.int64)
    return to_jax_dtype(torch.get_default_dtype())


@lowering(aten.arange.default)
def arange(end, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.arange(end, dtype=_arange_dtype(dtype, end))


@lowering(aten.arange.start)
def arange_start(start, end, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.arange(start, end, dtype=_arange_dtype(dtype, start, end))


@lowering(aten.arange.start_step)
def arange_start_step(start, end, step=1, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.arange(start, end, step, dtype=_arange_dtype(dtype, start, end, step))


@lowering(aten.eye.default)
def eye(n, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.eye(n, dtype=_dtype(dtype))


@lowering(aten.eye.m)
def eye_m(n, m, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.eye(n, m, dtype=_dtype(dtype))


@lowering(aten.linspace.default)
def linspace(start, end, steps, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.linspace(start, end, steps, dtype=_dtype(dtype))


@lowering(aten.fill.Scalar, aten.fill.Tensor)
def fill(x, value):
    return jnp.full(x.shape, value, x.dtype)
