"""Fused attention kernels that survive decomposition in training graphs.

The forward is decomposed by PyTorch's table; the CPU flash-attention backward is not,
so it is lowered as the VJP of plain softmax attention (dropout_p must be 0: the
backward has no way to replay the forward's dropout mask).
"""
import math

import jax
import jax.numpy as jnp
import torch

from bridge import precision
from bridge.ops.registry import lowering

aten = torch.ops.aten


def _attention(q, k, v, is_causal, attn_mask, scale):
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if k.shape[-3] != q.shape[-3]:  # grouped-query attention: repeat kv heads
        rep = q.shape[-3] // k.shape[-3]
        k, v = jnp.repeat(k, rep, axis=-3), jnp.repeat(v, rep, axis=-3)
    s = precision.einsum("...qd,...kd->...qk", q, k) * scale
    if is_causal:
        lq, lk = s.shape[-2:]
        s = jnp.where(jnp.tril(jnp.ones((lq, lk), bool)), s, -jnp.inf)
    if attn_mask is not None:
        s = jnp.where(attn_mask, s, -jnp.inf) if attn_mask.dtype == jnp.bool_ else s + attn_mask
    return precision.einsum("...qk,...kd->...qd", jax.nn.softmax(s, axis=-1), v)


@lowering(aten._scaled_dot_product_flash_attention_for_cpu.default)
def flash_attention_cpu(q, k, v, dropout_p=0.0, is_causal=False, attn_mask=None, scale=None):
    out = _attention(q, k, v, is_causal, attn_mask, scale)
    return out, jnp.zeros(q.shape[:-1], jnp.float32)


@lowering(aten._scaled_dot_product_flash_attention_for_cpu_backward.default)
def flash_attention_cpu_backward(grad, q, k, v, out, lse, dropout_p, is_causal, attn_mask=None,
                                 scale=None):
    if dropout_p:
        raise NotImplementedError("attention backward with dropout_p > 0 cannot be lowered")
    _, vjp = jax.vjp(lambda a, b, c: _attention(a, b, c, is_causal, attn_mask, scale), q, k, v)
    return vjp(grad.astype(q.dtype))
