"""`cerebras.pytorch.nn.functional`: functions Cerebras adds beside `torch.nn.functional`.

Each is written with static-shape tensor ops, so it traces into a compiled step; on a
Cerebras system the sparse ones run as sparse kernels, here as their dense equivalents,
which compute the same values.
"""
from typing import Optional

import torch

__all__ = ["one_hot", "sparse_matmul", "sparse_act_matmul"]


def one_hot(tensor: torch.Tensor, num_classes: int = -1) -> torch.Tensor:
    """`torch.nn.functional.one_hot`, made of a comparison with ``arange(num_classes)``:
    an int64 tensor of shape ``tensor.shape + (num_classes,)`` with a 1 at each value's
    class. `tensor` may hold any integer dtype. Give `num_classes` inside a traced step:
    without it (-1) the count is ``tensor.max() + 1``, which reads a tensor's value.
    A value outside ``[0, num_classes)`` gives a row of zeros (PyTorch raises instead).
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"one_hot expects a tensor, got {type(tensor).__name__}")
    if tensor.is_floating_point() or tensor.is_complex() or tensor.dtype == torch.bool:
        raise TypeError(f"one_hot expects a tensor of integers, got {tensor.dtype}")
    if num_classes is None or num_classes < 0:
        num_classes = int(tensor.max()) + 1 if tensor.numel() else 0
    classes = torch.arange(num_classes, device=tensor.device, dtype=tensor.dtype)
    return (tensor.unsqueeze(-1) == classes).to(torch.int64)


def sparse_matmul(input: torch.Tensor, indices: torch.Tensor,
                  weights: torch.Tensor) -> torch.Tensor:
    """Apply one expert's weight matrix per slot: for top-k mixture-of-experts layers.

    - `input`: ``(..., K, in_features)``, one row per (token, chosen expert) slot;
    - `indices`: ``(..., K)`` integers, the expert of each slot; a value outside
      ``[0, num_experts)`` (Model Zoo uses -1) selects no expert and gives zeros;
    - `weights`: ``(out_features, num_experts, in_features)``.

    Returns ``(..., K, out_features)`` with ``out[..., k, :] = weights[:, indices[..., k],
    :] @ input[..., k, :]``. Computed densely: each expert's product over all slots,
    kept where the slot chose that expert.
    """
    if weights.dim() != 3:
        raise ValueError(f"sparse_matmul expects weights of shape (out_features, num_experts, "
                         f"in_features), got {tuple(weights.shape)}")
    if input.shape[:-1] != indices.shape:
        raise ValueError(f"sparse_matmul: input {tuple(input.shape)} must be indices' shape "
                         f"{tuple(indices.shape)} plus in_features")
    if input.shape[-1] != weights.shape[2]:
        raise ValueError(f"sparse_matmul: input has {input.shape[-1]} features, the weights "
                         f"take {weights.shape[2]}")
    out = None
    for expert in range(weights.shape[1]):
        chosen = (indices == expert).unsqueeze(-1)
        part = torch.where(chosen, torch.matmul(input, weights[:, expert, :].transpose(0, 1)), 0)
        out = part if out is None else out + part
    if out is None:   # no experts at all
        return input.new_zeros(input.shape[:-1] + (weights.shape[0],))
    return out


def sparse_act_matmul(input: torch.Tensor, act_mask: torch.Tensor, weight: torch.Tensor,
                      dense_capacity: Optional[int] = None) -> torch.Tensor:
    """A linear layer (no bias) computed only for active tokens: ``input @ weight.T`` where
    `act_mask` is non-zero and 0 elsewhere.

    - `input`: ``(..., in_features)``; `act_mask`: ``input.shape[:-1]`` (any dtype,
      non-zero = active); `weight`: ``(out_features, in_features)``.
    - `dense_capacity`: on a Cerebras system, how many active tokens the kernel provisions
      for; it does not change the values and is ignored here.
    """
    if weight.dim() != 2:
        raise ValueError(f"sparse_act_matmul expects a weight of shape (out_features, "
                         f"in_features), got {tuple(weight.shape)}")
    if act_mask.shape != input.shape[:-1]:
        raise ValueError(f"sparse_act_matmul: act_mask {tuple(act_mask.shape)} must be input's "
                         f"shape {tuple(input.shape)} without its last dimension")
    if dense_capacity is not None and (not isinstance(dense_capacity, int) or dense_capacity < 0):
        raise ValueError(f"dense_capacity must be None or a non-negative int, got {dense_capacity!r}")
    active = (act_mask != 0).unsqueeze(-1)
    return torch.where(active, torch.matmul(input, weight.transpose(0, 1)), 0)
