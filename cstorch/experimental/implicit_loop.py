"""Autoregressive generation with an implicit loop.

On a Cerebras system, the ops between `start_implicit_loop` and `update_implicit_loop`
become a loop that runs on the device until generation ends. So it does here in a traced
step: the step's body is captured once and compiled as one `jax.lax.while_loop`
(`cstorch.tracing.implicit_loop_program`), so that one call of the step generates up to
`max_tokens` tokens per sequence, stopping each sequence at its stop sequences and the
loop when every sequence is done or full. Outside a traced step (eager), a call runs the
body once: one token per sequence.

The sequences follow Model Zoo's layout: each prompt is followed by padding with
`start_token` up to the sequence length, and generated tokens replace the padding from
left to right. A generated token equal to `start_token` reads as padding in the next
iteration, which then predicts at the same position again.
"""
import warnings

import torch

from cstorch.tracing import implicit_loop_program

_warned: list = []   # the not-applied warning is given once per process

__all__ = ["start_implicit_loop", "get_loop_iteration_slice", "update_implicit_loop"]


def _check_dim(tensor: torch.Tensor, dim: int, what: str) -> int:
    if not -tensor.dim() <= dim < tensor.dim():
        raise ValueError(f"{what}: loop_dim {dim} is out of range for a tensor of shape "
                         f"{tuple(tensor.shape)}")
    return dim % tensor.dim()


def _loop_dim(index_tensor: torch.Tensor) -> int:
    """The loop dimension of an index from `start_implicit_loop`: the one it recorded, else
    the last dimension of size 1 (an index of a [B, S] input is [B, 1])."""
    dim = getattr(index_tensor, _LOOP_DIM, None)
    if dim is not None:
        return dim
    ones = [d for d, n in enumerate(index_tensor.shape) if n == 1]
    if not ones:
        raise ValueError(f"an index of shape {tuple(index_tensor.shape)} has no loop dimension "
                         f"(of size 1); pass the index start_implicit_loop returned")
    return ones[-1]


_LOOP_DIM = "_cstorch_loop_dim"


def start_implicit_loop(input_tensor: torch.Tensor, loop_dim: int) -> torch.Tensor:
    """Where this iteration predicts from: for each sequence of `input_tensor` (along
    `loop_dim`), the position of its last token before the trailing padding.

    The padding is the run of values equal to the sequence's last value at its end (the
    `start_token` padding of a prompt). Returns an int64 tensor of `input_tensor`'s shape
    with `loop_dim` of size 1. A sequence that is all padding gives position 0.
    """
    dim = _check_dim(input_tensor, loop_dim, "start_implicit_loop")
    length = input_tensor.shape[dim]
    last = input_tensor.narrow(dim, length - 1, 1)
    is_pad = (input_tensor == last).to(torch.int64)
    # 1 at every position from which only padding follows.
    trailing = torch.flip(torch.cumprod(torch.flip(is_pad, (dim,)), dim=dim), (dim,))
    first_pad = length - trailing.sum(dim=dim, keepdim=True)
    index = torch.clamp(first_pad - 1, min=0)
    setattr(index, _LOOP_DIM, dim)   # read by get_loop_iteration_slice and update_implicit_loop
    recorder = implicit_loop_program.current()
    if recorder is not None:
        recorder.note_start(input_tensor, index)
    return index


def get_loop_iteration_slice(input_tensor: torch.Tensor, index_tensor: torch.Tensor
                             ) -> torch.Tensor:
    """The entries of `input_tensor` at this iteration's position: it is indexed along the
    loop dimension by `index_tensor` (from `start_implicit_loop`), which covers its
    leading dimensions; trailing dimensions (features) are kept. ``hidden[B, S, H]`` and
    an index ``[B, 1]`` give ``[B, 1, H]``."""
    tensor = input_tensor
    dim = _check_dim(tensor, _loop_dim(index_tensor), "get_loop_iteration_slice")
    if index_tensor.dim() > tensor.dim():
        raise ValueError(f"get_loop_iteration_slice: an index of shape "
                         f"{tuple(index_tensor.shape)} cannot index a tensor of shape "
                         f"{tuple(tensor.shape)}")
    index = index_tensor.to(torch.int64).reshape(
        tuple(index_tensor.shape) + (1,) * (tensor.dim() - index_tensor.dim()))
    shape = list(tensor.shape)
    shape[dim] = 1
    return torch.gather(tensor, dim, index.expand(shape))


def update_implicit_loop(input_tensor: torch.Tensor, index_tensor: torch.Tensor,
                         update_tensor: torch.Tensor,
                         stop_sequences_tensor: torch.Tensor | None,
                         start_token: int | list[int] | None,
                         max_tokens: int | None = None) -> torch.Tensor:
    """`input_tensor` with this iteration's predictions written after its last token.

    `update_tensor` holds one token per sequence (shaped like `index_tensor` or with
    the loop dimension squeezed out); it is written at ``index + 1`` where that position still
    holds padding (`start_token`, an int or a list of ints; None: the sequence's last
    value, as `start_implicit_loop` reads it). A sequence that is full is returned
    unchanged.

    `stop_sequences_tensor` (shape (batch, number, length), or (number, length) shared by
    every sequence, each stop sequence padded with `start_token`; rows of padding are none)
    and `max_tokens` end the loop: in a traced step, the step generates until each sequence ends
    with one of its stop sequences, has `max_tokens` new tokens, or is full. Eager, a call
    generates one token and they cannot apply (a warning says so once).
    """
    recorder = implicit_loop_program.current()
    if recorder is None and (stop_sequences_tensor is not None or max_tokens is not None) \
            and not _warned:
        _warned.append(True)
        warnings.warn(
            "update_implicit_loop: called outside a traced step, it generates one token per "
            "call, so stop_sequences_tensor and max_tokens are not applied; inside a "
            "@cstorch.trace step the whole generation runs as one compiled loop that applies "
            "them", stacklevel=2)
    dim = _check_dim(input_tensor, _loop_dim(index_tensor), "update_implicit_loop")
    length = input_tensor.shape[dim]
    index = index_tensor.to(torch.int64)
    position = index + 1
    inside = position < length
    position = torch.clamp(position, max=length - 1)
    current = torch.gather(input_tensor, dim, position)
    if start_token is None:
        pad = input_tensor.narrow(dim, length - 1, 1)
        is_pad = current == pad
    else:
        tokens = [start_token] if isinstance(start_token, int) else list(start_token)
        is_pad = torch.zeros_like(current, dtype=torch.bool)
        for token in tokens:
            is_pad = is_pad | (current == token)
    new = update_tensor.to(input_tensor.dtype).reshape(index.shape)
    value = torch.where(inside & is_pad, new, current)
    result = torch.scatter(input_tensor, dim, position, value)
    if recorder is not None:
        recorder.note_update(input_tensor, index_tensor, result, stop_sequences_tensor,
                             start_token, max_tokens)
    return result
