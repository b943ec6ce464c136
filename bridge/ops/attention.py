"""CPU flash attention, forward and backward, lowered as one op each.

The forward is not decomposed: its lowering and the backward's compute the scores and
their softmax with the same function, so XLA's common-subexpression pass computes them
once for both, where a decomposed forward and a recomputing backward computed them twice.
The backward uses the flash-attention form (dS = P * (dO V^T - rowsum(dO * O))). Rows
whose keys are all masked give zeros, as the kernel does. dropout_p must be 0: torch
sends attention with dropout to its math path, and a backward could not replay the mask.
"""
import math

import jax.numpy as jnp
import torch

from bridge import precision
from bridge.ops.registry import lowering

aten = torch.ops.aten


def _no_dropout(dropout_p):
    if dropout_p:
        raise NotImplementedError(
            f"CPU flash attention with dropout_p={dropout_p} cannot be lowered; torch computes "
            f"attention with dropout through its math path, which can")


def _repeat_kv(q, k, v):
    """k and v with their heads repeated to q's count (grouped-query attention)."""
    rep = q.shape[-3] // k.shape[-3]
    if rep == 1:
        return k, v
    return jnp.repeat(k, rep, axis=-3), jnp.repeat(v, rep, axis=-3)


def _scale(q, scale):
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale


def _softmax(q, k, is_causal, attn_mask, scale):
    """(P, logsumexp) of the scaled, masked scores, in float32 at least; a row with every
    key masked has P = 0 and logsumexp 0."""
    s = precision.einsum("...qd,...kd->...qk", q, k) * _scale(q, scale)
    s = s.astype(jnp.promote_types(s.dtype, jnp.float32))
    if is_causal:
        lq, lk = s.shape[-2:]
        s = jnp.where(jnp.tril(jnp.ones((lq, lk), bool)), s, -jnp.inf)
    if attn_mask is not None:
        s = jnp.where(attn_mask, s, -jnp.inf) if attn_mask.dtype == jnp.bool_ else s + attn_mask
    top = jnp.max(s, axis=-1, keepdims=True)
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    e = jnp.exp(s - top)
    total = jnp.sum(e, axis=-1, keepdims=True)
    masked = total == 0
    p = e / jnp.where(masked, 1.0, total)
    lse = jnp.where(masked, 0.0, jnp.log(total) + top)[..., 0]
    return p, lse


@lowering(aten._scaled_dot_product_flash_attention_for_cpu.default)
def flash_attention_cpu(q, k, v, dropout_p=0.0, is_causal=False, attn_mask=None, scale=None):
    _no_dropout(dropout_p)
    k, v = _repeat_kv(q, k, v)
    p, lse = _softmax(q, k, is_causal, attn_mask, scale)
    return precision.einsum("...qk,...kd->...qd", p.astype(v.dtype), v), lse


@lowering(aten._scaled_dot_product_flash_attention_for_cpu_backward.default)
def flash_attention_cpu_backward(grad, q, k, v, out, lse, dropout_p, is_causal, attn_mask=None,
                                 scale=None):
    _no_dropout(dropout_p)
    heads_kv = k.shape[-3]
    k, v = _repeat_kv(q, k, v)
    # P again rather than from `lse`: the same ops as the forward's, which XLA merges.
    p, _ = _softmax(q, k, is_causal, attn_mask, scale)
    grad = grad.astype(q.dtype)
    dv = precision.einsum("...qk,...qd->...kd", p.astype(v.dtype), grad)
    dp = precision.einsum("...qd,...kd->...qk", grad, v).astype(p.dtype)
    rows = jnp.sum(grad.astype(p.dtype) * out.astype(p.dtype), axis=-1, keepdims=True)
    ds = p * (dp - rows) * _scale(q, scale)
    ds = ds.astype(q.dtype)
    dq = precision.einsum("...qk,...kd->...qd", ds, k)
    dk = precision.einsum("...qk,...qd->...kd", ds, q)

    def per_kv_head(g):   # the repeated heads' gradients summed back onto their head
        rep = g.shape[-3] // heads_kv
        return g if rep == 1 else g.reshape(
            g.shape[:-3] + (heads_kv, rep) + g.shape[-2:]).sum(axis=-3)
    return dq, per_kv_head(dk), per_kv_head(dv)
