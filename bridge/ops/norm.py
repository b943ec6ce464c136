"""Layer, batch and group normalisation, forward and backward.

Backward ops are the vector-Jacobian products of the forward lowerings, so the two can
never disagree.
"""
import jax
import jax.numpy as jnp
import torch

from bridge.ops.registry import lowering

aten = torch.ops.aten


def _layer_norm(x, normalized_shape, weight, bias, eps):
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    xf = x.astype(jnp.float32) if x.dtype in (jnp.float16, jnp.bfloat16) else x
    mean = jnp.mean(xf, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(xf - mean), axis=axes, keepdims=True)
    rstd = jax.lax.rsqrt(var + eps)
    out = (xf - mean) * rstd
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out.astype(x.dtype), mean, rstd


@lowering(aten.native_layer_norm.default)
def native_layer_norm(x, normalized_shape, weight, bias, eps):
    return _layer_norm(x, normalized_shape, weight, bias, eps)


@lowering(aten.native_layer_norm_backward.default)
def native_layer_norm_backward(grad, x, normalized_shape, mean, rstd, weight, bias, output_mask):
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    batch_axes = tuple(range(x.ndim - len(normalized_shape)))
    xhat = (x - mean) * rstd
    gxhat = grad * weight if weight is not None else grad
    gx = rstd * (gxhat - jnp.mean(gxhat, axis=axes, keepdims=True)
                 - xhat * jnp.mean(gxhat * xhat, axis=axes, keepdims=True))
    gw = jnp.sum(grad * xhat, axis=batch_axes) if weight is not None else None
    gb = jnp.sum(grad, axis=batch_axes) if bias is not None else None
    return tuple(v if m else None for v, m in zip((gx, gw, gb), output_mask))


def _batch_norm_train(x, weight, bias, eps):
    axes = (0,) + tuple(range(2, x.ndim))
    shape = [1, -1] + [1] * (x.ndim - 2)
    mean = jnp.mean(x, axis=axes)
    var = jnp.mean(jnp.square(x - mean.reshape(shape)), axis=axes)
    rstd = jax.lax.rsqrt(var + eps)
    out = (x - mean.reshape(shape)) * rstd.reshape(shape)
    if weight is not None:
        out = out * weight.reshape(shape)
    if bias is not None:
        out = out + bias.reshape(shape)
    return out, mean, var, rstd


def _batch_norm_eval(x, weight, bias, running_mean, running_var, eps):
    shape = [1, -1] + [1] * (x.ndim - 2)
    out = (x - running_mean.reshape(shape)) * jax.lax.rsqrt(running_var.reshape(shape) + eps)
    if weight is not None:
        out = out * weight.reshape(shape)
    if bias is not None:
        out = out + bias.reshape(shape)
    return out


def _updated_stats(x, mean, var, running_mean, running_var, momentum):
    n = x.size // x.shape[1]
    unbiased = var * (n / max(n - 1, 1))
    new_mean = (1 - momentum) * running_mean + momentum * mean
    new_var = (1 - momentum) * running_var + momentum * unbiased
    return new_mean, new_var


@lowering(aten._native_batch_norm_legit_functional.default)
def batch_norm_functional(x, weight, bias, running_mean, running_var, training, momentum, eps):
    if training:
        out, mean, var, rstd = _batch_norm_train(x, weight, bias, eps)
        new_mean, new_var = _updated_stats(x, mean, var, running_mean, running_var, momentum)
        return out, mean, rstd, new_mean, new_var
    out = _batch_norm_eval(x, weight, bias, running_mean, running_var, eps)
    empty = jnp.zeros((0,), x.dtype)
    return out, empty, empty, running_mean, running_var


@lowering(aten._native_batch_norm_legit.no_stats)
def batch_norm_no_stats(x, weight, bias, training, momentum, eps):
    out, mean, _, rstd = _batch_norm_train(x, weight, bias, eps)
    return out, mean, rstd


@lowering(aten._native_batch_norm_legit_no_training.default)
def batch_norm_no_training(x, weight, bias, running_mean, running_var, momentum, eps):
    out = _batch_norm_eval(x, weight, bias, running_mean, running_var, eps)
    empty = jnp.zeros((0,), x.dtype)
    return out, empty, empty


@lowering(aten.native_batch_norm_backward.default)
def native_batch_norm_backward(grad, x, weight, running_mean, running_var, save_mean, save_invstd,
                               train, eps, output_mask):
    if weight is None:
        weight = jnp.ones((x.shape[1],), x.dtype)
    bias = jnp.zeros_like(weight)
    if train:
        _, vjp = jax.vjp(lambda x, w, b: _batch_norm_train(x, w, b, eps)[0], x, weight, bias)
    else:
        _, vjp = jax.vjp(lambda x, w, b: _batch_norm_eval(x, w, b, running_mean, running_var, eps),
                         x, weight, bias)
    return tuple(v if m else None for v, m in zip(vjp(grad), output_mask))


@lowering(aten.native_group_norm.default)
def native_group_norm(x, weight, bias, n, c, hw, group, eps):
    g = x.reshape(n, group, (c // group) * hw)  # not -1: an empty batch has no size to infer
    mean = jnp.mean(g, axis=-1)
    var = jnp.var(g, axis=-1)
    rstd = jax.lax.rsqrt(var + eps)
    out = ((g - mean[..., None]) * rstd[..., None]).reshape(x.shape)
    shape = [1, -1] + [1] * (x.ndim - 2)
    if weight is not None:
        out = out * weight.reshape(shape)
    if bias is not None:
        out = out + bias.reshape(shape)
    return out, mean, rstd


@lowering(aten.native_batch_norm.default)
def native_batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps):
    # Left in a graph only where it mutates nothing: evaluation, or training without stats.
    if training or running_mean is None:
        out, mean, _, rstd = _batch_norm_train(x, weight, bias, eps)
        return out, mean, rstd
    out = _batch_norm_eval(x, weight, bias, running_mean, running_var, eps)
    empty = jnp.zeros((0,), x.dtype)
    return out, empty, empty


@lowering(aten.native_group_norm_backward.default)
def native_group_norm_backward(grad, x, mean, rstd, weight, n, c, hw, group, mask):
    shape = [1, -1] + [1] * (x.ndim - 2)
    xhat = ((x.reshape(n, group, -1) - mean[..., None]) * rstd[..., None]).reshape(x.shape)
    dxhat = grad * weight.reshape(shape) if weight is not None else grad
    g_dxhat = dxhat.reshape(n, group, -1)
    g_xhat = xhat.reshape(n, group, -1)
    gx = rstd[..., None] * (g_dxhat - jnp.mean(g_dxhat, -1, keepdims=True)
                            - g_xhat * jnp.mean(g_dxhat * g_xhat, -1, keepdims=True))
    axes = (0,) + tuple(range(2, x.ndim))
    return (gx.reshape(x.shape) if mask[0] else None,
            jnp.sum(grad * xhat, axis=axes) if mask[1] else None,
            jnp.sum(grad, axis=axes) if mask[2] else None)


@lowering(aten._native_batch_norm_legit.default)
def native_batch_norm_legit(x, weight, bias, running_mean, running_var, training, momentum, eps):
    """The out-of-place form: running stats are updated by the functional variant."""
    axes = (0,) + tuple(range(2, x.ndim))
    shape = [1, -1] + [1] * (x.ndim - 2)
    if training:
        mean, var = jnp.mean(x, axis=axes), jnp.var(x, axis=axes)
    else:
        mean, var = running_mean, running_var
    rstd = 1 / jnp.sqrt(var + eps)
    out = (x - mean.reshape(shape)) * rstd.reshape(shape)
    if weight is not None:
        out = out * weight.reshape(shape)
    if bias is not None:
        out = out + bias.reshape(shape)
    if not training:
        return out, jnp.zeros((0,), x.dtype), jnp.zeros((0,), x.dtype)
    return out, mean, rstd


def _norm_except_dim(v, dim):
    """ATen's norm_except_dim(v, 2, dim): the 2-norm over every dimension but `dim`, kept
    broadcastable against `v` (over all of `v`, 0-d, for dim -1)."""
    if dim == -1:
        return jnp.sqrt(jnp.sum(jnp.square(v)))
    axes = tuple(a for a in range(v.ndim) if a != dim % v.ndim)
    return jnp.sqrt(jnp.sum(jnp.square(v), axis=axes, keepdims=True))


def _weight_norm(v, g, dim):
    return v * (g / _norm_except_dim(v, dim))


@lowering(aten._weight_norm_interface.default)
def weight_norm_interface(v, g, dim=0):
    return _weight_norm(v, g, dim), _norm_except_dim(v, dim).astype(g.dtype)


@lowering(aten._weight_norm_interface_backward.default)
def weight_norm_interface_backward(grad_w, saved_v, saved_g, saved_norms, dim):
    _, vjp = jax.vjp(lambda v, g: _weight_norm(v, g, dim), saved_v, saved_g)
    return vjp(grad_w)
