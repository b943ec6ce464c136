"""Special functions (`torch.special`, gamma family, Bessel functions, orthogonal polynomials)."""
import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax.scipy import special as jsp

from bridge.ops.registry import lowering

aten = torch.ops.aten


def _float(x):
    x = jnp.asarray(x)
    return x if jnp.issubdtype(x.dtype, jnp.floating) else x.astype(jnp.float32)


def _erfcx(x):
    # exp(x^2) erfc(x) overflows for large x: switch to the asymptotic series there.
    x = _float(x)
    big = x > 10
    xs = jnp.where(big, 1.0, x)
    direct = jnp.exp(xs * xs) * jsp.erfc(xs)
    xb = jnp.where(big, x, 11.0)
    inv2 = 1.0 / (2 * xb * xb)
    series = (1 - inv2 + 3 * inv2 ** 2 - 15 * inv2 ** 3) / (xb * jnp.sqrt(jnp.pi))
    return jnp.where(big, series, direct)


def _spherical_j0(x):
    x = _float(x)
    small = jnp.abs(x) < 1e-4
    safe = jnp.where(small, 1.0, x)
    return jnp.where(small, 1 - x * x / 6, jnp.sin(safe) / safe)


for _op, _fn in {
    aten.special_i0e: lambda x: jsp.i0e(_float(x)),
    aten.special_i1: lambda x: jsp.i1(_float(x)),
    aten.special_i1e: lambda x: jsp.i1e(_float(x)),
    aten.special_ndtri: lambda x: jsp.ndtri(_float(x)),
    aten.special_ndtr: lambda x: jsp.ndtr(_float(x)),
    aten.special_log_ndtr: lambda x: jsp.log_ndtr(_float(x)),
    aten.special_erfcx: _erfcx,
    aten.special_spherical_bessel_j0: _spherical_j0,
    aten.special_modified_bessel_i0: lambda x: jsp.i0(_float(x)),
    aten.special_modified_bessel_i1: lambda x: jsp.i1(_float(x)),
    aten.special_entr: lambda x: jnp.where(x > 0, -x * jnp.log(jnp.where(x > 0, x, 1)),
                                           jnp.where(x == 0, 0.0, -jnp.inf)),
    aten.sinc: lambda x: jnp.sinc(_float(x)),
}.items():
    lowering(_op)(lambda x, _fn=_fn: _fn(x))

@lowering(aten.igamma.default)
def igamma(a, x):
    return jsp.gammainc(_float(a), _float(x))


@lowering(aten.igammac.default)
def igammac(a, x):
    return jsp.gammaincc(_float(a), _float(x))


@lowering(aten.polygamma.default)
def polygamma(n, x):
    x = _float(x)
    if n == 0:
        return jsp.digamma(x)
    # jax's polygamma (a Hurwitz zeta) is wrong for x < 0: step x up past 1 with
    # psi_n(x) = psi_n(x + 1) - (-1)^n n! / x^(n+1), then evaluate there.
    steps = jnp.maximum(jnp.ceil(1 - jnp.min(x, initial=1.0)), 0).astype(jnp.int32)
    sign_fact = (-1.0) ** n * float(np.prod(np.arange(1, n + 1)))

    def body(k, carry):
        shifted, total = carry
        below = shifted < 1
        total = total - jnp.where(below, sign_fact / jnp.where(below, shifted, 1) ** (n + 1), 0)
        return jnp.where(below, shifted + 1, shifted), total
    shifted, total = jax.lax.fori_loop(0, steps, body, (x, jnp.zeros_like(x)))
    return jsp.polygamma(n, shifted) + total


@lowering(aten.mvlgamma.default)
def mvlgamma(x, p):
    x = _float(x)
    j = jnp.arange(p, dtype=x.dtype)
    return (p * (p - 1) / 4 * jnp.log(jnp.pi)
            + jnp.sum(jsp.gammaln(x[..., None] - j / 2), axis=-1))


@lowering(aten.special_zeta.default, aten.special_zeta.self_scalar, aten.special_zeta.other_scalar)
def zeta(x, q):
    return jsp.zeta(_float(x), _float(q))


@lowering(aten.special_xlog1py.default, aten.special_xlog1py.self_scalar,
          aten.special_xlog1py.other_scalar)
def xlog1py(x, y):
    return jsp.xlog1py(_float(x), _float(y))


def _recurrence(first, second, step, shift=None):
    """An orthogonal polynomial P_n(x) by its three-term recurrence; n is a tensor."""
    def poly(x, n):
        x = _float(x)
        if shift is not None:
            x = shift(x)
        # ATen converts the degree to int64 first, so a fractional degree truncates.
        n = jnp.trunc(jnp.asarray(n))
        x, n = jnp.broadcast_arrays(x, n.astype(x.dtype))
        p0, p1 = first(x), second(x)
        top = jnp.maximum(jnp.max(n, initial=0), 1).astype(jnp.int32)

        def body(k, carry):
            a, b, out = carry
            c = step(k, x, a, b)
            out = jnp.where(n == k + 1, c, out)
            return b, c, out
        out = jnp.where(n == 0, p0, jnp.where(n == 1, p1, jnp.zeros_like(x)))
        _, _, out = jax.lax.fori_loop(1, top, body, (p0, p1, out))
        return jnp.where(n < 0, 0.0, out)
    return poly


_ones = jnp.ones_like
_POLYS = {
    "chebyshev_polynomial_t": _recurrence(_ones, lambda x: x, lambda k, x, a, b: 2 * x * b - a),
    "chebyshev_polynomial_u": _recurrence(_ones, lambda x: 2 * x, lambda k, x, a, b: 2 * x * b - a),
    "chebyshev_polynomial_v": _recurrence(_ones, lambda x: 2 * x - 1, lambda k, x, a, b: 2 * x * b - a),
    "chebyshev_polynomial_w": _recurrence(_ones, lambda x: 2 * x + 1, lambda k, x, a, b: 2 * x * b - a),
    "hermite_polynomial_h": _recurrence(_ones, lambda x: 2 * x,
                                        lambda k, x, a, b: 2 * x * b - 2 * k * a),
    "hermite_polynomial_he": _recurrence(_ones, lambda x: x, lambda k, x, a, b: x * b - k * a),
    "laguerre_polynomial_l": _recurrence(_ones, lambda x: 1 - x,
                                         lambda k, x, a, b: ((2 * k + 1 - x) * b - k * a) / (k + 1)),
    "legendre_polynomial_p": _recurrence(_ones, lambda x: x,
                                         lambda k, x, a, b: ((2 * k + 1) * x * b - k * a) / (k + 1)),
}
for _kind in "tuvw":
    _POLYS[f"shifted_chebyshev_polynomial_{_kind}"] = _recurrence(
        _ones, {"t": lambda x: x, "u": lambda x: 2 * x, "v": lambda x: 2 * x - 1,
                "w": lambda x: 2 * x + 1}[_kind],
        lambda k, x, a, b: 2 * x * b - a, shift=lambda x: 2 * x - 1)

for _name, _poly in _POLYS.items():
    _packet = getattr(aten, "special_" + _name)
    lowering(_packet)(lambda x, n, _poly=_poly: _poly(x, n))
