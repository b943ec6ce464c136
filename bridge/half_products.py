"""Products of half-precision tensors with float32 ones, taken as a CSX compile takes them.

Code written for Cerebras systems casts activations to the half dtype and multiplies them
with float32 weights (Model Zoo's mixture-of-experts block does so whenever
`cstorch.use_cs()`): the weights stay float32 masters and the product is computed in the
half dtype. PyTorch's kernels refuse such a product ("expected m1 and m2 to have the same
dtype"). Under `HalfProducts`, a matrix product or convolution whose floating operands are
float32 and exactly one half dtype (float16 or bfloat16) gets its float32 operands rounded
to that half dtype first, as `torch.autocast` rounds them, so the result is in the half
dtype and the float32 operands' gradients flow back through the rounding. Every other call
passes unchanged, so operands in one dtype, or in float32 and float64, are what they were.
"""
import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree
from torch.overrides import TorchFunctionMode

_T = torch.Tensor
# Matrix products and convolutions: PyTorch's kernels take their floating operands in one
# dtype.
PRODUCTS = frozenset({
    F.linear, F.bilinear, torch.matmul, _T.matmul, _T.__matmul__, _T.__rmatmul__,
    torch.mm, _T.mm, torch.bmm, _T.bmm, torch.addmm, _T.addmm, torch.baddbmm, _T.baddbmm,
    torch.addbmm, _T.addbmm, torch.mv, _T.mv, torch.addmv, _T.addmv, torch.dot, _T.dot,
    torch.inner, torch.outer, torch.einsum, F.conv1d, F.conv2d, F.conv3d,
    F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d,
})
_HALF = (torch.float16, torch.bfloat16)


def _half_dtype(args, kwargs):
    """The half dtype the operands mix with float32, or None where they do not."""
    floats = {t.dtype for t in pytree.tree_leaves((args, kwargs))
              if isinstance(t, _T) and t.dtype.is_floating_point}
    if len(floats) != 2 or torch.float32 not in floats:
        return None
    (other,) = floats - {torch.float32}
    return other if other in _HALF else None


class HalfProducts(TorchFunctionMode):
    """While active, products of float32 and half operands are computed in the half dtype.
    On leaving, `taken(names)` hears the names of the calls that were, if any."""

    def __init__(self, taken=None):
        super().__init__()
        self.taken, self.names = taken, set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in PRODUCTS:
            half = _half_dtype(args, kwargs)
            if half is not None:
                self.names.add(getattr(func, "__name__", str(func)))
                args, kwargs = pytree.tree_map_only(
                    _T, lambda t: t.to(half) if t.dtype == torch.float32 else t,
                    (args, kwargs))
        return func(*args, **kwargs)

    def __exit__(self, *exc):
        super().__exit__(*exc)
        if self.names and self.taken is not None:
            self.taken(self.names)
