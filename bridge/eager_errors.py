"""The errors eager PyTorch raises for a call that a capture would take, or would refuse
with another message.

A capture runs torch's calls on fake tensors through the core-ATen decompositions, and
these skip checks of eager's CPU kernels: a float64 batch fed to a float32 `nn.Linear`
is promoted by `addmm`'s decomposition, int32 class targets pass `nll_loss`'s, and a
wrong shape fails in a meta kernel with its own wording ("a and b must have same
reduction dim"). Where a call is suspect (operands of a dtype-strict op in several
floating dtypes, class targets that are not int64) or failed, it is run eagerly on zeros
of the same shapes and dtypes; what eager raises then is raised as eager raised it.
"""
import warnings

import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.utils._python_dispatch import _disable_current_modes

from bridge.half_products import PRODUCTS

_T = torch.Tensor
# Calls whose CPU kernels require every floating operand in one dtype (eager raises "mat1
# and mat2 must have the same dtype", "mixed dtype (CPU)", "Input type (double) and bias
# type (float) should be the same", ...), where a decomposition would promote instead.
_SAME_DTYPE = PRODUCTS | frozenset({
    F.layer_norm, F.group_norm, F.batch_norm, F.instance_norm, F.prelu,
    F.scaled_dot_product_attention,
})
# Losses over class indices: eager takes int64 (or uint8) targets only.
_CLASS_TARGETS = {F.cross_entropy: 1, F.nll_loss: 1, F.multi_margin_loss: 1}
# Past this many elements a call is not re-run (its zeros would cost real memory).
_MAX_ELEMENTS = 1 << 26


def suspect(func, args, kwargs) -> bool:
    """Whether eager PyTorch may refuse this call though the capture would take it."""
    if func in _SAME_DTYPE:
        if torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled("cuda"):
            return False   # autocast casts the operands to one dtype itself
        floats = {t.dtype for t in pytree.tree_leaves((args, kwargs))
                  if isinstance(t, _T) and t.dtype.is_floating_point}
        return len(floats) > 1
    position = _CLASS_TARGETS.get(func)
    if position is None:
        return False
    target = kwargs.get("target", args[position] if len(args) > position else None)
    return (isinstance(target, _T) and not target.dtype.is_floating_point
            and target.dtype not in (torch.int64, torch.uint8))


def eager_error(func, args, kwargs) -> BaseException | None:
    """What eager PyTorch raises for `func` on zeros shaped as `args` and `kwargs`, or None
    when it would run (or the call is too large to re-run)."""
    tensors = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, _T)]
    if sum(t.numel() for t in tensors) > _MAX_ELEMENTS:
        return None
    with _disable_current_modes(), unset_fake_temporarily(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        real_args, real_kwargs = pytree.tree_map_only(
            _T, lambda t: torch.zeros(tuple(t.shape), dtype=t.dtype), (args, kwargs))
        try:
            func(*real_args, **real_kwargs)
        except Exception as e:   # noqa: BLE001 (whatever eager raises is the answer)
            return e
    return None


def as_raised_by_eager(error: BaseException, message: str) -> BaseException:
    """An exception of eager's type carrying `message` (eager's, with the user's line)."""
    try:
        return type(error)(message)
    except Exception:   # noqa: BLE001 (a type that takes other arguments)
        return RuntimeError(message)
