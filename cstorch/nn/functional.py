"""`cerebras.pytorch.nn.functional`: functions Cerebras adds beside `torch.nn.functional`.

Each is written with static-shape tensor ops, so it traces into a compiled step. On a
Cerebras system several run as kernels of their own; here they run as their dense
equivalents, which compute the same values. Each `CSX*` class is the
`torch.autograd.Function` its function applies, with its gradient written out.
Three kernels (`ranged_matmul`, `nth_order_statistic`, `conditional_arange`) are not
documented closely enough to compute their values here; they raise NotImplementedError
rather than return a guess.
"""

import torch

from cstorch.mesh import layout as _layout
from cstorch.mesh.placement import ShardingSpec

__all__ = [
    "one_hot", "sparse_matmul", "sparse_act_matmul", "matmul", "ranged_matmul", "bias_add",
    "nth_order_statistic", "conditional_arange", "enter_scope", "exit_scope", "scope_boundary",
    "unbind", "CSXBiasAdd", "CSXConditionalArange", "CSXD2DTransfer", "CSXM2MTransfer",
    "CSXMatMul", "CSXMeshAllGather", "CSXMeshAllSlice", "CSXMeshShard", "CSXNthOrderStatisic",
    "CSXRangedMatMul", "CSXSparseActMatMul", "CSXSparseMatMul", "EnterFunction",
    "ExitFunction", "UnbindFunction",
]


def _not_documented(name: str, what: str):
    return NotImplementedError(
        f"cstorch.nn.functional.{name} is not implemented: the reference documents no "
        f"{what}, so its values cannot be reproduced here")


def _fresh(out: torch.Tensor, input: torch.Tensor) -> torch.Tensor:
    """A Function's output that is a new tensor, never its input (which autograd would turn
    into a view that cannot be modified in place)."""
    return out.clone() if out is input else out


def _flat_rows(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-1])


# ---- matrix products -------------------------------------------------------------------

def _check_linear(name, weight, input_value):
    if weight.dim() != 2:
        raise ValueError(f"{name} expects a weight of shape (out_features, in_features), got "
                         f"{tuple(weight.shape)}")
    if input_value.dim() < 1 or input_value.shape[-1] != weight.shape[1]:
        raise ValueError(f"{name}: input_value {tuple(input_value.shape)} must end in the "
                         f"weight's in_features {weight.shape[1]}")


class CSXMatMul(torch.autograd.Function):
    """``input_value @ weight.T``: `weight` (out, in), `input_value` (..., in)."""

    @staticmethod
    def forward(ctx, weight, input_value, weight_transposed):
        _check_linear("matmul", weight, input_value)
        if weight_transposed is not None:
            if not isinstance(weight_transposed, torch.Tensor) \
                    or tuple(weight_transposed.shape) != tuple(weight.shape[::-1]):
                raise ValueError(
                    f"matmul: weight_transposed must be None or the weight's transpose, of "
                    f"shape {tuple(weight.shape[::-1])}, got "
                    f"{getattr(weight_transposed, 'shape', weight_transposed)!r}")
        ctx.save_for_backward(weight, input_value)
        return torch.matmul(input_value, weight.transpose(0, 1))

    @staticmethod
    def backward(ctx, grad_output):
        weight, input_value = ctx.saved_tensors
        grad_input = torch.matmul(grad_output, weight)
        grad_weight = torch.matmul(_flat_rows(grad_output).transpose(0, 1), _flat_rows(input_value))
        return grad_weight, grad_input, None


def matmul(weight, input_value, weight_transposed=None):
    """The product ``[..., Hi] x [Ho, Hi]^T = [..., Ho]``: `input_value` times the transpose of
    `weight`, as `torch.nn.functional.linear` without bias. `weight_transposed`, when
    given, is ``weight.T`` laid out for the backward pass; it does not change the values."""
    return CSXMatMul.apply(weight, input_value, weight_transposed)


class CSXRangedMatMul(torch.autograd.Function):
    """`ranged_matmul`'s Function: not implemented (see `ranged_matmul`)."""

    @staticmethod
    def forward(ctx, weight, input_value, num_cols, weight_transposed):
        raise _not_documented("ranged_matmul", "rule for which part of the product num_cols "
                                               "keeps and what the rest holds")

    @staticmethod
    def backward(ctx, grad_output):
        raise _not_documented("ranged_matmul", "gradient")


def ranged_matmul(weight, input_value, num_cols, weight_transposed=None):
    """A `matmul` limited per batch row by the tensor `num_cols`. Which part of the product
    it keeps, and what the rest holds, is not documented: raises NotImplementedError."""
    return CSXRangedMatMul.apply(weight, input_value, num_cols, weight_transposed)


class CSXSparseMatMul(torch.autograd.Function):
    """`sparse_matmul` computed densely: each expert's product over all slots, kept where
    the slot chose that expert."""

    @staticmethod
    def forward(ctx, input_values, input_indices, weight):
        if weight.dim() != 3:
            raise ValueError(f"sparse_matmul expects weight of shape (out_features, num_experts, "
                             f"in_features), got {tuple(weight.shape)}")
        if input_values.shape[:-1] != input_indices.shape:
            raise ValueError(f"sparse_matmul: input_values {tuple(input_values.shape)} must be "
                             f"input_indices' shape {tuple(input_indices.shape)} plus in_features")
        if input_values.shape[-1] != weight.shape[2]:
            raise ValueError(f"sparse_matmul: input_values have {input_values.shape[-1]} "
                             f"features, the weight takes {weight.shape[2]}")
        ctx.save_for_backward(input_values, input_indices, weight)
        out = input_values.new_zeros(input_values.shape[:-1] + (weight.shape[0],))
        for expert in range(weight.shape[1]):
            chosen = (input_indices == expert).unsqueeze(-1)
            product = torch.matmul(input_values, weight[:, expert, :].transpose(0, 1))
            out = out + torch.where(chosen, product, 0)
        return out

    @staticmethod
    def backward(ctx, grad_output):
        input_values, input_indices, weight = ctx.saved_tensors
        grad_input = torch.zeros_like(input_values)
        grad_weight = []
        for expert in range(weight.shape[1]):
            chosen = (input_indices == expert).unsqueeze(-1)
            grad_here = torch.where(chosen, grad_output, 0)
            grad_input = grad_input + torch.matmul(grad_here, weight[:, expert, :])
            grad_weight.append(torch.matmul(_flat_rows(grad_here).transpose(0, 1),
                                            _flat_rows(input_values)))
        grad_weight = torch.stack(grad_weight, 1) if grad_weight else torch.zeros_like(weight)
        return grad_input, None, grad_weight


def sparse_matmul(input_values, input_indices, weight):
    """Apply one expert's weight matrix per slot, for top-k mixture-of-experts layers.

    - `input_values`: ``(..., K, in_features)``, one row per (token, chosen expert) slot;
    - `input_indices`: ``(..., K)`` integers, the expert of each slot; a value outside
      ``[0, num_experts)`` (Model Zoo uses -1) selects no expert and gives zeros;
    - `weight`: ``(out_features, num_experts, in_features)``.

    Returns ``(..., K, out_features)`` with ``out[..., k, :] = weight[:, input_indices[..., k],
    :] @ input_values[..., k, :]``.
    """
    return CSXSparseMatMul.apply(input_values, input_indices, weight)


class CSXSparseActMatMul(torch.autograd.Function):
    """`sparse_act_matmul` computed densely, masked after the product."""

    @staticmethod
    def forward(ctx, input_value, input_mask, weight, dense_capacity):
        if weight.dim() != 2:
            raise ValueError(f"sparse_act_matmul expects a weight of shape (out_features, "
                             f"in_features), got {tuple(weight.shape)}")
        if input_mask.shape != input_value.shape[:-1]:
            raise ValueError(f"sparse_act_matmul: input_mask {tuple(input_mask.shape)} must be "
                             f"input_value's shape {tuple(input_value.shape)} without its last "
                             f"dimension")
        if dense_capacity is not None and (not isinstance(dense_capacity, int)
                                           or isinstance(dense_capacity, bool)
                                           or dense_capacity < 0):
            raise ValueError(f"dense_capacity must be None or a non-negative int, got "
                             f"{dense_capacity!r}")
        active = (input_mask != 0).unsqueeze(-1)
        ctx.save_for_backward(input_value, active, weight)
        return torch.where(active, torch.matmul(input_value, weight.transpose(0, 1)), 0)

    @staticmethod
    def backward(ctx, grad_output):
        input_value, active, weight = ctx.saved_tensors
        grad_here = torch.where(active, grad_output, 0)
        grad_weight = torch.matmul(_flat_rows(grad_here).transpose(0, 1), _flat_rows(input_value))
        return torch.matmul(grad_here, weight), None, grad_weight, None


def sparse_act_matmul(input_value, input_mask, weight, dense_capacity=None):
    """A linear layer (no bias) computed only for active tokens: ``input_value @ weight.T``
    where `input_mask` is non-zero and 0 elsewhere.

    - `input_value`: ``(..., in_features)``; `input_mask`: ``input_value.shape[:-1]`` (any
      dtype, non-zero = active); `weight`: ``(out_features, in_features)``.
    - `dense_capacity`: on a Cerebras system, how many active tokens the kernel provisions
      for; it does not change the values, and here provisions nothing (a warning, once).
    """
    if dense_capacity is not None:
        _layout.placement_not_modelled("sparse_act_matmul(dense_capacity=...)")
    return CSXSparseActMatMul.apply(input_value, input_mask, weight, dense_capacity)


# ---- elementwise and selection -----------------------------------------------------------

class CSXBiasAdd(torch.autograd.Function):
    """``input_value + bias`` with the vector `bias` along dimension `dim`."""

    @staticmethod
    def forward(ctx, input_value, bias, dim):
        if not isinstance(dim, int) or not -input_value.dim() <= dim < input_value.dim():
            raise IndexError(f"bias_add: dim {dim!r} is not a dimension of an input of shape "
                             f"{tuple(input_value.shape)}")
        dim %= input_value.dim()
        if bias.dim() != 1 or bias.shape[0] != input_value.shape[dim]:
            raise ValueError(f"bias_add: bias must be a vector of {input_value.shape[dim]} "
                             f"(input dimension {dim}), got shape {tuple(bias.shape)}")
        ctx.dim, ctx.bias_dtype = dim, bias.dtype
        shape = [1] * input_value.dim()
        shape[dim] = -1
        return input_value + bias.reshape(shape)

    @staticmethod
    def backward(ctx, grad_output):
        others = [d for d in range(grad_output.dim()) if d != ctx.dim]
        grad_bias = grad_output.sum(others) if others else grad_output
        return grad_output, grad_bias.to(ctx.bias_dtype), None


def bias_add(input_value, bias, dim):
    """Add the vector `bias` to `input_value` along dimension `dim`: element ``i`` of
    `bias` is added to every element whose index along `dim` is ``i``."""
    return CSXBiasAdd.apply(input_value, bias, dim)


class CSXNthOrderStatisic(torch.autograd.Function):
    """`nth_order_statistic`'s Function: not implemented (see `nth_order_statistic`)."""

    @staticmethod
    def forward(ctx, input_value, k, dimension):
        raise _not_documented("nth_order_statistic", "base of k (0 or 1) nor what is returned "
                                                     "(values, indices)")

    @staticmethod
    def backward(ctx, grad_output):
        raise _not_documented("nth_order_statistic", "gradient")


def nth_order_statistic(input, k, dimension):
    """The k-th smallest value along `dimension`. Whether `k` counts from 0 or 1, and whether
    indices come back too, is not documented: raises NotImplementedError
    (`torch.kthvalue` is the 1-based equivalent)."""
    return CSXNthOrderStatisic.apply(input, k, dimension)


class CSXConditionalArange(torch.autograd.Function):
    """`conditional_arange`'s Function: not implemented (see `conditional_arange`)."""

    @staticmethod
    def forward(ctx, mask, start, step, dtype):
        raise _not_documented("conditional_arange", "value for positions the mask leaves out "
                                                    "nor the order the count runs in")

    @staticmethod
    def backward(ctx, grad_output):
        raise _not_documented("conditional_arange", "gradient")


def conditional_arange(mask, start, step, dtype=None):
    """An arange from `start` by `step` counted over the positions `mask` selects. What the
    other positions hold is not documented: raises NotImplementedError."""
    return CSXConditionalArange.apply(mask, start, step, dtype)


def one_hot(array, num_classes):
    """`torch.nn.functional.one_hot`, made of a comparison with ``arange(num_classes)``:
    an int64 tensor of shape ``array.shape + (num_classes,)`` with a 1 at each value's
    class. `array` may hold any integer dtype. `num_classes` -1 takes
    ``array.max() + 1``, which reads a value and so cannot be used inside a traced step.
    A value outside ``[0, num_classes)`` gives a row of zeros (PyTorch raises instead).
    """
    if not isinstance(array, torch.Tensor):
        raise TypeError(f"one_hot expects a tensor, got {type(array).__name__}")
    if array.is_floating_point() or array.is_complex() or array.dtype == torch.bool:
        raise TypeError(f"one_hot expects a tensor of integers, got {array.dtype}")
    if num_classes is None or num_classes < 0:
        num_classes = int(array.max()) + 1 if array.numel() else 0
    classes = torch.arange(num_classes, device=array.device, dtype=array.dtype)
    return (array.unsqueeze(-1) == classes).to(torch.int64)


# ---- scopes and unbind: identities for values ------------------------------------------

class EnterFunction(torch.autograd.Function):
    """Marks where the scope `scope_name` begins; the values pass through."""

    @staticmethod
    def forward(ctx, input, scope_name):
        return input.clone()

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output, None


class ExitFunction(torch.autograd.Function):
    """Marks where the scope `scope_name` ends; the values pass through."""

    @staticmethod
    def forward(ctx, input, scope_name):
        return input.clone()

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output, None


def enter_scope(input, scope_name):
    """Mark `input` as entering the scope `scope_name`; returns its values unchanged."""
    return EnterFunction.apply(input, scope_name)


def exit_scope(input, scope_name):
    """Mark `input` as leaving the scope `scope_name`; returns its values unchanged."""
    return ExitFunction.apply(input, scope_name)


def scope_boundary(input, boundary_type, scope_name):
    """Mark a boundary (`boundary_type`) of the scope `scope_name` on `input`; returns its
    values unchanged."""
    return EnterFunction.apply(input, scope_name)


class UnbindFunction(torch.autograd.Function):
    """`torch.unbind(input, 0)`, its gradient the stacked gradients of the parts."""

    @staticmethod
    def forward(ctx, input):
        return tuple(part.clone() for part in input.unbind(0))

    @staticmethod
    def backward(ctx, *grad_outputs):
        return torch.stack(grad_outputs, 0)


def unbind(tensor):
    """The slices of `tensor` along its first dimension, as `torch.unbind(tensor, 0)`."""
    return UnbindFunction.apply(tensor)


# ---- mesh layouts (cstorch.mesh) --------------------------------------------------------

class CSXMeshShard(torch.autograd.Function):
    """`cstorch.mesh.distribute_tensor` as a Function: the gradient has the same layout."""

    @staticmethod
    def forward(ctx, input, mesh_id, split_axes, names, partial_axes, partial_type, devices):
        ctx.spec = ShardingSpec(mesh_id, split_axes, partial_axes, partial_type, devices)
        ctx.names = names
        return _fresh(_layout.distribute_tensor(input, ctx.spec, names), input)

    @staticmethod
    def backward(ctx, grad_output):
        return (_layout.distribute_tensor(grad_output, ctx.spec, ctx.names),
                None, None, None, None, None, None)


class CSXMeshAllGather(torch.autograd.Function):
    """`cstorch.mesh.all_gather` as a Function; the values of the gradient pass through."""

    @staticmethod
    def forward(ctx, input, gather_axes):
        return _fresh(_layout.all_gather(input, gather_axes), input)

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output, None


class CSXMeshAllSlice(torch.autograd.Function):
    """`cstorch.mesh.all_slice` as a Function; the values of the gradient pass through."""

    @staticmethod
    def forward(ctx, input, split_axes, names):
        return _fresh(_layout.all_slice(input, split_axes, names), input)

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output, None, None


class CSXD2DTransfer(torch.autograd.Function):
    """`cstorch.mesh.d2d_transfer` as a Function: values pass through both ways."""

    @staticmethod
    def forward(ctx, input, dst_device):
        return _fresh(_layout.d2d_transfer(input, dst_device), input)

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output, None


class CSXM2MTransfer(torch.autograd.Function):
    """`cstorch.mesh.m2m_transfer` as a Function: values pass through both ways."""

    @staticmethod
    def forward(ctx, input, src_mesh_id, dst_mesh_id, src_root_id=None):
        return _fresh(_layout.m2m_transfer(input, src_mesh_id, dst_mesh_id,
                                           0 if src_root_id is None else src_root_id), input)

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output, None, None, None
