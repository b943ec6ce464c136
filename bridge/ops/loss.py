"""Fused losses that PyTorch keeps as single (custom) ops instead of decomposing, and the
backward ops of losses whose forward decomposes but whose gradient stays one ATen op."""
import jax
import jax.numpy as jnp
import torch

from bridge.ops.registry import lowering

aten = torch.ops.aten


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


def linear_cross_entropy_per_sample(x, linear_weight, target, linear_bias, weight,
                                    ignore_index, batch_chunk_size, acc_policy, acc_dtype):
    """`F.linear_cross_entropy(..., reduction='none')`: each sample's weighted negative
    log-likelihood, 0 where the target is ignored. Its backward runs as ATen ops."""
    logits = x @ linear_weight.T
    if linear_bias is not None:
        logits = logits + linear_bias
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    keep = target != ignore_index
    safe = jnp.where(keep, target, 0).astype(jnp.int32)
    w_t = 1.0 if weight is None else weight.astype(logp.dtype)[safe]
    nll = -jnp.take_along_axis(logp, safe[..., None], axis=-1)[..., 0] * w_t
    return jnp.where(keep, nll, 0).astype(x.dtype)


def _frames(x, reduction):
    """(frames, classes) of a margin loss's input, which is 0-d, (C,) or (N, C), and the
    factor ATen's backward scales each term by: 1 / classes, and 1 / frames more for a
    mean (reduction 1)."""
    frames = x.shape[0] if x.ndim == 2 else 1
    classes = x.shape[-1] if x.ndim else 1
    return frames, classes, 1.0 / (classes * (frames if reduction == 1 else 1))


def _times_grad_output(grad_input, grad_output, frames, reduction):
    """Each frame's gradient times its loss's incoming gradient (reduction 0, none) or
    times the one incoming gradient of the reduced loss."""
    if reduction == 0:
        return grad_input * grad_output.reshape(frames, 1)
    return grad_input * grad_output.reshape(())


@lowering(aten.multi_margin_loss_backward.default)
def multi_margin_loss_backward(grad_output, x, target, p, margin, weight=None, reduction=1):
    """Per frame, every class j other than the target y with z = margin - x[y] + x[j] > 0
    gets g (p = 1) or 2 g z (p = 2), times weight[y]; x[y] gets minus their sum."""
    frames, classes, g = _frames(x, reduction)
    xs = x.reshape(frames, classes)
    y = target.reshape(frames).astype(jnp.int32)
    z = margin - jnp.take_along_axis(xs, y[:, None], axis=1) + xs
    wrong = jnp.arange(classes)[None, :] != y[:, None]
    part = jnp.where(wrong & (z > 0), g if p == 1 else 2 * g * z, 0).astype(x.dtype)
    if weight is not None:
        part = part * weight[y][:, None]
    grad = part - jax.nn.one_hot(y, classes, dtype=x.dtype) * jnp.sum(part, 1, keepdims=True)
    return _times_grad_output(grad, grad_output, frames, reduction).reshape(x.shape)


def _listed_targets(target, frames, classes):
    """Each frame's target classes, 0 where unlisted, and whether each is listed: the
    entries before the frame's first negative one."""
    ys = target.reshape(frames, classes).astype(jnp.int32)
    listed = jnp.cumprod(ys >= 0, axis=1).astype(bool)
    return jnp.where(listed, ys, 0), listed


@lowering(aten.multilabel_margin_loss_forward.default)
def multilabel_margin_loss_forward(x, target, reduction):
    """Per frame, sum over its listed targets y and its other classes j of
    max(0, 1 - x[y] + x[j]) / classes; and `is_target`, 1 at the listed classes.

    PyTorch's core-ATen decomposition of this op also counts the entries after the first
    -1 (as if they were class 0) and so disagrees with ATen's kernel there; this lowering
    follows the kernel, for graphs that keep the op."""
    frames, classes, _ = _frames(x, 0)
    xs = x.reshape(frames, classes)
    ys, listed = _listed_targets(target, frames, classes)
    rows = jnp.arange(frames)[:, None]
    is_target = jnp.zeros((frames, classes), bool).at[rows, ys].max(listed)
    z = 1 - jnp.take_along_axis(xs, ys, axis=1)[:, :, None] + xs[:, None, :]
    keep = listed[:, :, None] & ~is_target[:, None, :]
    loss = jnp.sum(jnp.where(keep, jnp.maximum(z, 0), 0), axis=(1, 2)) / classes
    if reduction == 1:
        loss = jnp.mean(loss)
    elif reduction == 2:
        loss = jnp.sum(loss)
    # With reduction "none", a single frame's loss has shape (1,) as PyTorch's meta
    # function says (the graph around the op is traced with it), though the eager kernel
    # returns a 0-d tensor.
    return loss.astype(x.dtype), is_target.astype(x.dtype).reshape(target.shape)


@lowering(aten.multilabel_margin_loss_backward.default)
def multilabel_margin_loss_backward(grad_output, x, target, reduction, is_target):
    """Per frame, the targets are `target`'s entries before its first negative one; for
    each target y and each non-target class j (`is_target` 0) with 1 - x[y] + x[j] > 0,
    x[j] gets +g and x[y] gets -g."""
    frames, classes, g = _frames(x, reduction)
    xs = x.reshape(frames, classes)
    ys, listed = _listed_targets(target, frames, classes)
    x_y = jnp.take_along_axis(xs, ys, axis=1)
    z = 1 - x_y[:, :, None] + xs[:, None, :]  # (frame, k-th target, class j)
    hinge = listed[:, :, None] & (is_target.reshape(frames, 1, classes) == 0) & (z > 0)
    hinge = hinge.astype(x.dtype)
    grad = g * jnp.sum(hinge, axis=1)
    rows = jnp.arange(frames)[:, None]
    grad = grad.at[rows, ys].add(-g * jnp.sum(hinge, axis=2))
    return _times_grad_output(grad, grad_output, frames, reduction).reshape(x.shape)


try:  # the op is registered when its module is imported; older torch has no such op
    import torch.nn.modules.linear_cross_entropy  # noqa: F401
    lowering(torch.ops.torch_nn._linear_cross_entropy_batch_chunked.default)(
        linear_cross_entropy_chunked)
    lowering(torch.ops.torch_nn._linear_cross_entropy_batch_chunked_no_reduction.default)(
        linear_cross_entropy_per_sample)
except (ImportError, AttributeError):
    pass
