"""How a lowered result is held against eager PyTorch's."""
import torch
from torch.utils import _pytree as pytree

from bridge.convert import jax_to_tensor, to_jax_dtype

# (rtol, atol): a little looser than torch.testing's defaults, since XLA and ATen use
# different (both correct to a few ulp) transcendental kernels and reduction orders.
TOLERANCES = {
    torch.float32: (1e-4, 1e-5),
    torch.float64: (1e-4, 1e-5),  # computed in float32 with x64 off
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (1.6e-2, 1e-2),
}

# Ops whose result is whatever memory held (not random, not defined either): nothing
# but shape and dtype can be compared.
UNDEFINED_VALUES = {"empty", "empty_like", "empty_strided", "empty_permuted", "new_empty",
                    "new_empty_strided", "resize_", "resize_as_"}


def _eigh_invariant(outs):
    # Eigenvectors are unique only up to sign (and any rotation inside a repeated
    # eigenvalue's space): compare the eigenvalues and the reconstruction V diag(w) V^T.
    w, v = outs
    return [w, (v * w[..., None, :]) @ v.mT]


def _svd_invariant(v_is_transposed):
    # Singular vectors are unique only up to sign (and a rotation within a repeated
    # singular value): compare S and the reconstruction U diag(S) V^T, which are unique.
    def rule(outs):
        u, s, v = outs
        if u.numel() == 0 or v.numel() == 0:  # compute_uv=False: S alone
            return [s]
        k = s.shape[-1]
        vt = v[..., :k, :] if v_is_transposed else v[..., :, :k].mT
        return [s, (u[..., :, :k] * s[..., None, :]) @ vt]
    return rule


def _normwise(outs):
    # exp(A) has entries ~1e5 for the samples' |A| ~ 9; both kernels are accurate to
    # float32 eps * ||exp(A)|| (checked against float64), not elementwise to each entry.
    return [o / torch.linalg.matrix_norm(o)[..., None, None] for o in outs]


# Per-entry rules for forward outputs that are correct but not unique (or whose error is
# only meaningful in a norm): both eager's and our outputs go through the rule. Gradients
# need none: OpInfo's `output_process_fn_grad` already keeps only the unique part.
COMPARE_RULES = {
    "linalg.eigh": _eigh_invariant,
    "svd": _svd_invariant(v_is_transposed=False),
    "linalg.svd": _svd_invariant(v_is_transposed=True),
    "matrix_exp": _normwise,
}


def tensors_of(value):
    """The tensors of an op's result, flattened, complex ones as their (real, imag) pairs.

    The graph keeps complex intermediates (FFTs); only the boundary to eager PyTorch is
    real. An op that returns only Python numbers (`item`, `equal`, `allclose`) gives 0-d
    tensors of them; tracing it normally fails on the value read, which counts as refused.
    """
    leaves = pytree.tree_leaves(value)
    tensors = [torch.view_as_real(v.resolve_conj()) if v.is_complex() and v.layout == torch.strided
               else v for v in leaves if isinstance(v, torch.Tensor)]
    if not tensors:
        tensors = [torch.as_tensor(v) for v in leaves if isinstance(v, (bool, int, float))]
    return tensors


def as_eager(got, expected: torch.Tensor) -> torch.Tensor:
    """Our JAX result `got` as a torch tensor, after checking its dtype is the one JAX
    holds eager's dtype in (int64 and float64 run as int32 and float32 with x64 off)."""
    want = to_jax_dtype(expected.dtype)
    if got.dtype != want:
        raise AssertionError(f"dtype {got.dtype} != {want} (eager {expected.dtype})")
    return jax_to_tensor(got, expected.dtype)


def compare(expected: torch.Tensor, got: torch.Tensor, values: bool = True):
    """Raise AssertionError unless `got` matches eager's `expected`; shape and dtype always,
    values when `values` (random results compare shape and dtype only)."""
    if expected.shape != got.shape:
        raise AssertionError(f"shape {tuple(got.shape)} != eager {tuple(expected.shape)}")
    if expected.dtype != got.dtype:
        raise AssertionError(f"dtype {got.dtype} != eager {expected.dtype}")
    if not values or expected.numel() == 0:
        return
    rtol, atol = TOLERANCES.get(expected.dtype, (0, 0))
    torch.testing.assert_close(got, expected, rtol=rtol, atol=atol, equal_nan=True)


def compare_to_reference(expected: torch.Tensor, got: torch.Tensor, reference: torch.Tensor,
                         atol: float = 1e-7):
    """Raise AssertionError unless `got` is as close to the float64 `reference` as eager's
    `expected` is, within `atol`: PyTorch's own criterion for a decomposition whose
    elementwise comparison with eager fails (`op_assert_ref` in its test_decomp.py), for
    results where eager's float32 rounding error itself exceeds the tolerance (a gradient
    that is a sum of cancelling terms, exactly zero in exact arithmetic, say). NaN and
    infinite entries must sit where eager's do."""
    if not (torch.equal(torch.isnan(got), torch.isnan(expected))
            and torch.equal(torch.isinf(got), torch.isinf(expected))
            and torch.equal(got[torch.isinf(got)], expected[torch.isinf(expected)])):
        raise AssertionError("NaN or infinite entries differ from eager's")
    finite = torch.isfinite(expected) & torch.isfinite(reference)
    error = lambda t: (t.double() - reference)[finite].abs().max().item() if finite.any() else 0.0
    ours, eager = error(got), error(expected)
    if ours > eager + atol:
        raise AssertionError(f"values differ from eager, and from float64 by {ours:.3g} "
                             f"where eager's differ by {eager:.3g}")
