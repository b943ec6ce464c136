"""Fused losses that PyTorch keeps as single (custom) ops instead of decomposing."""
import jax
import jax.numpy as jnp
import torch

from bridge.ops.registry import lowering


def _cross_entropy(logits, target, weight, reduction, ignore_index, label_smoothing):
    """`F.cross_entropy` over class dim -1 with integer targets, in ATen's conventions."""
    classes = logits.shape[-1]
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    w = jnp.ones((classes,), logp.dtype) if weight is None else weight.astype(logp.dtype)
    keep = target != ignore_index
    safe = jnp.where(keep, target, 0).astype(jnp.int32)
    w_t = jnp.where(keep, w[safe], 0)
    nll = -jnp.take_along_axis(logp, safe[..., None], axis=-1)[..., 0] * w_t
    smooth = -jnp.sum(logp * w, axis=-1) * keep
    if reduction == "sum":
        total_nll, total_smooth = jnp.sum(nll), jnp.sum(smooth)
    else:  # mean: ATen divides the target term by the summed target weights
        total_nll = jnp.sum(nll) / jnp.sum(w_t)
        total_smooth = jnp.sum(smooth) / (jnp.sum(w_t) if weight is not None
                                          else jnp.sum(keep))
    if not label_smoothing:
        return total_nll
    return (1 - label_smoothing) * total_nll + label_smoothing / classes * total_smooth


def linear_cross_entropy_chunked(x, linear_weight, target, linear_bias, weight, reduction,
                                 ignore_index, label_smoothing, batch_chunk_size, acc_policy,
                                 acc_dtype, allow_retain_graph, compute_input_grad,
                                 compute_linear_weight_grad, compute_linear_bias_grad):
    # The op returns the loss with its gradients precomputed (its backward only scales
    # them), so the lowering does the same with one VJP; chunking is a memory device
    # for eager and XLA schedules the whole product itself.
    def loss(x, w, b):
        logits = x @ w.T
        if b is not None:
            logits = logits + b
        return _cross_entropy(logits, target, weight, reduction, ignore_index, label_smoothing)
    value, (gx, gw, gb) = jax.value_and_grad(loss, argnums=(0, 1, 2))(
        x, linear_weight, linear_bias if linear_bias is not None
        else jnp.zeros(linear_weight.shape[:-1], x.dtype))
    empty = lambda shape: jnp.zeros(shape, x.dtype)
    return (value.astype(x.dtype),
            gx if compute_input_grad else empty((0, 0)),
            gw if compute_linear_weight_grad else empty((0, 0)),
            gb if compute_linear_bias_grad else empty((0,)))


try:  # the op is registered when its module is imported; older torch has no such op
    import torch.nn.modules.linear_cross_entropy  # noqa: F401
    lowering(torch.ops.torch_nn._linear_cross_entropy_batch_chunked.default)(
        linear_cross_entropy_chunked)
except (ImportError, AttributeError):
    pass
