"""Matrix factorizations and solvers (`torch.linalg`), batched over leading dims.

The `*_ex` ops return an `info` tensor; XLA's factorizations do not report failure, so
info is always 0 (a singular input shows up as inf/nan in the result instead).
"""
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import torch
from jax._src.lax import linalg as lax_linalg

from bridge.ops.registry import lowering

aten = torch.ops.aten


def _info(a):
    return jnp.zeros(a.shape[:-2], jnp.int32)


def _mT(a):
    return jnp.swapaxes(a, -1, -2)


@lowering(aten.linalg_cholesky_ex.default)
def cholesky_ex(a, upper=False, check_errors=False):
    low = jnp.linalg.cholesky(a)
    return (_mT(low) if upper else low), _info(a)


@lowering(aten.cholesky.default)
def cholesky(a, upper=False):
    return cholesky_ex(a, upper)[0]


@lowering(aten.cholesky_solve.default)
def cholesky_solve(b, l, upper=False):
    low = _mT(l) if upper else l
    y = jsl.solve_triangular(low, b, lower=True)
    return jsl.solve_triangular(_mT(low), y, lower=False)


@lowering(aten.cholesky_inverse.default)
def cholesky_inverse(l, upper=False):
    eye = jnp.broadcast_to(jnp.eye(l.shape[-1], dtype=l.dtype), l.shape)
    return cholesky_solve(eye, l, upper)


@lowering(aten.linalg_inv_ex.default)
def inv_ex(a, check_errors=False):
    return jnp.linalg.inv(a), _info(a)


# `_linalg_det` and `_linalg_slogdet` also return an LU factorization, which their
# backward formulas solve with: ATen's is that of A^T (A's transpose), not of A, so the
# factors here are `lu_factor_ex(A^T)`'s; those of A give wrong gradients.
@lowering(aten._linalg_det.default)
def det(a):
    lu, piv, _ = lu_factor_ex(_mT(a))
    return jnp.linalg.det(a), lu, piv


@lowering(aten._linalg_slogdet.default)
def slogdet(a):
    sign, logabs = jnp.linalg.slogdet(a)
    lu, piv, _ = lu_factor_ex(_mT(a))
    return sign, logabs, lu, piv


@lowering(aten.linalg_lu_factor_ex.default)
def lu_factor_ex(a, pivot=True, check_errors=False):
    lu, piv, _ = jax.lax.linalg.lu(a)
    return lu, (piv + 1).astype(jnp.int32), _info(a)


def _perm_from_pivots(piv, m):
    """The row permutation LAPACK's 1-based sequential row swaps `piv` describe."""
    def one(p):
        perm = jnp.arange(m)

        def body(i, perm):
            j = p[i] - 1
            pi, pj = perm[i], perm[j]
            return perm.at[i].set(pj).at[j].set(pi)
        return jax.lax.fori_loop(0, p.shape[0], body, perm)
    if piv.size == 0:  # no swaps, and reshape(-1, 0) has no size to infer
        return jnp.broadcast_to(jnp.arange(m), piv.shape[:-1] + (m,))
    flat = piv.reshape(-1, piv.shape[-1])
    return jax.vmap(one)(flat).reshape(piv.shape[:-1] + (m,))


@lowering(aten.lu_unpack.default)
def lu_unpack(lu, piv, unpack_data=True, unpack_pivots=True):
    m, n = lu.shape[-2:]
    k = min(m, n)
    low = jnp.tril(lu[..., :, :k], -1) + jnp.eye(m, k, dtype=lu.dtype)
    up = jnp.triu(lu[..., :k, :])
    perm = _perm_from_pivots(piv, m)
    p = jax.nn.one_hot(perm, m, dtype=lu.dtype)  # p[i, j] = 1 where row i came from j
    return _mT(p), low, up


@lowering(aten.linalg_lu.default)
def linalg_lu(a, pivot=True):
    lu, piv, _ = lu_factor_ex(a)
    return lu_unpack(lu, piv)


@lowering(aten.linalg_lu_solve.default)
def lu_solve(lu, piv, b, left=True, adjoint=False):
    p, low, up = lu_unpack(lu, piv)
    if not left:
        # X A = B  <=>  A^T X^T = B^T
        return _mT(lu_solve_t(p, low, up, _mT(b), not adjoint))
    return lu_solve_t(p, low, up, b, adjoint)


def lu_solve_t(p, low, up, b, adjoint):
    if adjoint:  # A^T = U^T L^T P^T
        y = jsl.solve_triangular(_mT(up), b, lower=True)
        z = jsl.solve_triangular(_mT(low), y, lower=False, unit_diagonal=True)
        return p @ z
    y = jsl.solve_triangular(low, _mT(p) @ b, lower=True, unit_diagonal=True)
    return jsl.solve_triangular(up, y, lower=False)


@lowering(aten._linalg_solve_ex.default)
def solve_ex(a, b, left=True, check_errors=False):
    lu, piv, info = lu_factor_ex(a)
    vector = b.ndim == 1 or (b.ndim == a.ndim - 1 and b.shape == a.shape[:-1])
    bb = b[..., None] if vector else b
    x = jnp.linalg.solve(a, bb) if left else _mT(jnp.linalg.solve(_mT(a), _mT(bb)))
    return (x[..., 0] if vector else x), lu, piv, info


@lowering(aten.linalg_solve_triangular.default)
def solve_triangular(a, b, upper, left=True, unitriangular=False):
    if left:
        return jsl.solve_triangular(a, b, lower=not upper, unit_diagonal=unitriangular)
    return _mT(jsl.solve_triangular(_mT(a), _mT(b), lower=upper, unit_diagonal=unitriangular))


@lowering(aten.triangular_solve.default)
def triangular_solve(b, a, upper=True, transpose=False, unitriangular=False):
    a = jnp.broadcast_to(a, jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + a.shape[-2:])
    b = jnp.broadcast_to(b, a.shape[:-2] + b.shape[-2:])
    x = jsl.solve_triangular(a, b, trans=1 if transpose else 0, lower=not upper,
                             unit_diagonal=unitriangular)
    return x, a


@lowering(aten.linalg_qr.default)
def qr(a, mode="reduced"):
    q, r = jnp.linalg.qr(a, mode="complete" if mode == "complete" else "reduced")
    if mode == "r":
        return jnp.zeros((0,), a.dtype), r
    return q, r


@lowering(aten._linalg_eigh.default)
def eigh(a, UPLO="L", compute_v=True):
    w, v = jnp.linalg.eigh(a, UPLO=UPLO, symmetrize_input=False)
    return w, (v if compute_v else jnp.zeros((0,), a.dtype))


@lowering(aten._linalg_svd.default)
def svd(a, full_matrices=False, compute_uv=True, driver=None):
    if not compute_uv:
        s = jnp.linalg.svd(a, compute_uv=False)
        return jnp.zeros((0,), a.dtype), s, jnp.zeros((0,), a.dtype)
    u, s, vh = jnp.linalg.svd(a, full_matrices=full_matrices)
    return u, s, vh


@lowering(aten.linalg_pinv.atol_rtol_tensor, aten.linalg_pinv.atol_rtol_float)
def pinv(a, atol=None, rtol=None, hermitian=False):
    if hermitian:
        # ATen reads only the lower triangle here (eigh), so an input that is not exactly
        # symmetric gives a different answer than the SVD of the whole matrix would.
        w, v = jnp.linalg.eigh(a, UPLO="L", symmetrize_input=False)
        s = jnp.abs(w)
    else:
        u, s, vh = jnp.linalg.svd(a, full_matrices=False)
    smax = jnp.max(s, axis=-1, keepdims=True, initial=0.0)
    # torch: rtol defaults to eps * max(m, n) unless a positive atol alone is given
    atol_given = atol is not None and not (isinstance(atol, (int, float)) and atol == 0)
    atol = 0.0 if atol is None else jnp.asarray(atol)[..., None]
    if rtol is None:
        rtol = 0.0 if atol_given else max(a.shape[-2:]) * jnp.finfo(a.dtype).eps
    else:
        rtol = jnp.asarray(rtol)[..., None]
    cutoff = jnp.maximum(atol, rtol * smax)
    if hermitian:
        winv = jnp.where(s > cutoff, 1 / jnp.where(s > cutoff, w, 1), 0)
        return v @ (winv[..., :, None] * _mT(v))
    sinv = jnp.where(s > cutoff, 1 / jnp.where(s > cutoff, s, 1), 0)
    return _mT(vh) @ (sinv[..., :, None] * _mT(u))


@lowering(aten.linalg_matrix_exp.default)
def matrix_exp(a):
    return jsl.expm(a)


@lowering(aten.linalg_householder_product.default)
def householder_product(a, tau):
    m, n = a.shape[-2:]
    k = tau.shape[-1]
    q = jnp.broadcast_to(jnp.eye(m, n, dtype=a.dtype), a.shape)
    for i in reversed(range(k)):
        v = jnp.where(jnp.arange(m)[:, None] > i, a[..., :, i:i + 1], 0)
        v = v.at[..., i, 0].set(1)
        q = q - tau[..., i, None, None] * (v @ (_mT(v) @ q))
    return q


@lowering(aten.geqrf.default)
def geqrf(a):
    r, tau = lax_linalg.geqrf(a)
    return r, tau


@lowering(aten.ormqr.default)
def ormqr(a, tau, c, left=True, transpose=False):
    m = a.shape[-2]
    q = householder_product(jnp.pad(a, [(0, 0)] * (a.ndim - 1) + [(0, max(0, m - a.shape[-1]))])
                            [..., :, :m], tau)
    if transpose:
        q = _mT(q)
    return q @ c if left else c @ q


@lowering(aten.linalg_eig.default)
def eig(a):
    w, v = jnp.linalg.eig(a)
    return w, v


@lowering(aten.addmv.default)
def addmv(x, mat, vec, beta=1, alpha=1):
    out = alpha * (mat @ vec)
    return out if beta == 0 else beta * x + out


@lowering(aten.addr.default)
def addr(x, v1, v2, beta=1, alpha=1):
    out = alpha * jnp.outer(v1, v2)
    return out if beta == 0 else beta * x + out


@lowering(aten._cdist_forward.default)
def cdist(x1, x2, p, compute_mode=None):
    diff = jnp.abs(x1[..., :, None, :] - x2[..., None, :, :])
    return _pnorm(diff, p)


def _pnorm(diff, p):
    if p == 0:
        return jnp.sum(diff != 0, axis=-1).astype(diff.dtype)
    if p == float("inf"):
        return jnp.max(diff, axis=-1)
    if p == 2:
        sq = jnp.sum(diff * diff, axis=-1)
        return jnp.sqrt(sq)
    if p == 1:
        return jnp.sum(diff, axis=-1)
    return jnp.sum(diff ** p, axis=-1) ** (1.0 / p)


def _pnorm_slope(diff, dist, p):
    """d dist / d diff for dist = ||diff||_p (dist broadcast against diff), with ATen's
    zeros: at a zero distance, and for p < 1 at a zero difference, where the formula
    sign(d) |d|^(p-1) / dist^(p-1) is NaN or infinite."""
    zero = jnp.zeros((), diff.dtype)
    if p == 0:
        return jnp.zeros_like(diff)
    if p == 1:
        return jnp.sign(diff)
    if p == float("inf"):
        return jnp.where(jnp.abs(diff) == dist, jnp.sign(diff), zero)
    safe_dist = jnp.where(dist == 0, 1, dist)
    safe_diff = jnp.where(diff == 0, 1, jnp.abs(diff))
    return jnp.where((dist == 0) | (diff == 0), zero,
                     jnp.sign(diff) * (safe_diff / safe_dist) ** (p - 1))


@lowering(aten._cdist_backward.default)
def cdist_backward(grad, x1, x2, p, dist):
    """Gradient of `cdist` for `x1` (autograd swaps the arguments for `x2`), by the
    derivative of the p-norm. Written out rather than as the VJP of `cdist`: at a zero
    distance (cdist(x, x)'s diagonal), and for p < 1 at a zero difference, the VJP is NaN
    where ATen gives 0.

    Like ATen's kernel the result has `x1` broadcast to the batch dims of both inputs
    (autograd sums it back to x1's shape), except when that batch, a row count or the
    feature count is empty: then it is zeros shaped like `x1` itself."""
    batch = jnp.broadcast_shapes(x1.shape[:-2], x2.shape[:-2])
    if x1.shape[-2] == 0 or x2.shape[-2] == 0 or x1.shape[-1] == 0 or 0 in batch:
        return jnp.zeros_like(x1)
    diff = x1[..., :, None, :] - x2[..., None, :, :]
    slope = _pnorm_slope(diff, dist[..., None], p)
    return jnp.sum(grad[..., None] * slope, axis=-2)


@lowering(aten._pdist_forward.default)
def pdist(x, p=2.0):
    n = x.shape[0]
    i, j = jnp.triu_indices(n, 1)
    return _pnorm(jnp.abs(x[i] - x[j]), p)


@lowering(aten._pdist_backward.default)
def pdist_backward(grad, x, p, dist):
    """Gradient of `pdist`: the pair (i, j), i < j, in `triu_indices` order as the forward
    lists it, adds grad * slope(x_i - x_j) to row i and subtracts it from row j."""
    i, j = jnp.triu_indices(x.shape[0], 1)
    part = grad[:, None] * _pnorm_slope(x[i] - x[j], dist[:, None], p)
    return jnp.zeros_like(x).at[i].add(part).at[j].add(-part)


@lowering(aten.dist.default)
def dist(x, y, p=2):
    return _pnorm(jnp.abs(x - y).reshape(-1), p)


@lowering(aten._trilinear.default)
def trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    prod = jnp.expand_dims(i1, expand1) * jnp.expand_dims(i2, expand2) * jnp.expand_dims(i3, expand3)
    return jnp.sum(prod, axis=tuple(sumdim)) if sumdim else prod
