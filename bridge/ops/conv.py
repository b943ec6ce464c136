"""Convolutions, forward and backward (the backward is the forward's VJP)."""
import functools

import jax
import jax.numpy as jnp
import torch

from bridge import precision
from bridge.convert import to_torch_dtype
from bridge.ops.registry import lowering

aten = torch.ops.aten
_PLAIN_TRANSPOSED = (torch._C._ConvBackend.SlowTranspose2d, torch._C._ConvBackend.SlowTranspose3d)


@functools.cache
def _transposed_rounds_once(x_shape, w_shape, dtype, stride, padding, dilation, output_padding,
                            groups) -> bool:
    """Whether eager PyTorch's half-precision transposed convolution of these sizes adds its
    bias before its one rounding. oneDNN's kernel, which torch picks where the CPU computes
    half precision in it (AVX-512), does; the plain kernel (col2im into a half-precision
    output, picked elsewhere) rounds the product, then adds. Asked of torch's own choice,
    on tensors of the sizes that are never filled."""
    dtype = to_torch_dtype(dtype)
    backend = torch._C._select_conv_backend(
        torch.empty(x_shape, dtype=dtype), torch.empty(w_shape, dtype=dtype),
        torch.empty(w_shape[1] * groups, dtype=dtype), list(stride), list(padding),
        list(dilation), True, list(output_padding), groups, None)
    return backend not in _PLAIN_TRANSPOSED


def _conv(x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    # half precision with a bias: PyTorch's convolutions add the bias to the float32
    # accumulator and round once; its transposed convolutions do as its kernel does
    half = bias is not None and precision.is_half(x, w) and (
        not transposed or _transposed_rounds_once(
            tuple(x.shape), tuple(w.shape), x.dtype, tuple(stride), tuple(padding),
            tuple(dilation), tuple(output_padding), groups))
    conv = precision.conv_float32 if half else precision.conv
    nd = x.ndim - 2
    spatial = "DHW"[-nd:] if nd <= 3 else None
    dims = jax.lax.conv_dimension_numbers(
        x.shape, w.shape, (f"NC{spatial}", f"OI{spatial}" if not transposed else f"IO{spatial}",
                           f"NC{spatial}"))
    stride, padding, dilation = (list(v) * nd if len(v) == 1 else list(v)
                                 for v in (stride, padding, dilation))
    if not transposed:
        out = conv(
            x, w, window_strides=stride, padding=[(p, p) for p in padding],
            rhs_dilation=dilation, dimension_numbers=dims, feature_group_count=groups)
    else:
        output_padding = list(output_padding) * nd if len(output_padding) == 1 else list(output_padding)
        if groups != 1:
            # (I, O/g, ...) -> (g, I/g, O/g, ...) -> (O, I/g, ...) as a regular grouped conv.
            i, og = w.shape[0], w.shape[1]
            w = w.reshape((groups, i // groups, og) + w.shape[2:])
            w = jnp.swapaxes(w, 1, 2).reshape((groups * og, i // groups) + w.shape[3:])
            dims = jax.lax.conv_dimension_numbers(
                x.shape, w.shape, (f"NC{spatial}", f"OI{spatial}", f"NC{spatial}"))
        else:
            w = jnp.swapaxes(w, 0, 1)
            dims = jax.lax.conv_dimension_numbers(
                x.shape, w.shape, (f"NC{spatial}", f"OI{spatial}", f"NC{spatial}"))
        k = w.shape[2:]
        pads = [(d * (kk - 1) - p, d * (kk - 1) - p + op)
                for kk, p, d, op in zip(k, padding, dilation, output_padding)]
        out = conv(
            x, jnp.flip(w, tuple(range(2, 2 + nd))), window_strides=[1] * nd, padding=pads,
            lhs_dilation=stride, rhs_dilation=dilation, dimension_numbers=dims,
            feature_group_count=groups)
    if bias is not None:
        out = out + bias.reshape((1, -1) + (1,) * nd)
    return out.astype(x.dtype) if half else out


@lowering(aten.convolution.default)
def convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    return _conv(x, w, bias, stride, padding, dilation, transposed, output_padding, groups)


@lowering(aten.convolution_backward.default)
def convolution_backward(grad, x, w, bias_sizes, stride, padding, dilation, transposed,
                         output_padding, groups, output_mask):
    _, vjp = jax.vjp(lambda x, w: _conv(x, w, None, stride, padding, dilation, transposed,
                                        output_padding, groups), x, w)
    gx, gw = vjp(grad)
    gb = jnp.sum(grad, axis=(0,) + tuple(range(2, grad.ndim))) if bias_sizes is not None else None
    return tuple(v if m else None for v, m in zip((gx, gw, gb), output_mask))
