"""Bessel and Airy functions of real argument, from their integral representations.

jax.scipy ships no Y, K or Airy functions and its `bessel_jn` loses accuracy past small
arguments, so each function here is a fixed Gauss-Legendre quadrature of a classical
integral (smooth integrands, so the rule converges geometrically) for moderate
arguments, and Hankel's asymptotic series for large ones. Both are accurate to a few
float32 ulp over the whole real line.
"""
import jax.numpy as jnp
import numpy as np
import torch

from bridge.ops.registry import lowering

aten = torch.ops.aten
_NODES, _WEIGHTS = np.polynomial.legendre.leggauss(96)  # on [-1, 1]
_LARGE = 25.0  # above this |x| the asymptotic series is the more accurate


def _float(x):
    x = jnp.asarray(x)
    return x if jnp.issubdtype(x.dtype, jnp.floating) else x.astype(jnp.float32)


def _quad(f, a, b):
    """∫_a^b f(t) dt for per-element bounds `a`, `b` (arrays shaped like the result)."""
    half = (b - a)[..., None] / 2
    t = a[..., None] + half * (jnp.asarray(_NODES, a.dtype) + 1)
    return jnp.sum(f(t) * jnp.asarray(_WEIGHTS, a.dtype), axis=-1) * half[..., 0]


def _hankel(nu, x):
    """(P, Q, chi) of Hankel's expansion: J = sqrt(2/(pi x)) (P cos chi - Q sin chi),
    Y = sqrt(2/(pi x)) (P sin chi + Q cos chi)."""
    mu = 4.0 * nu * nu
    z = 8.0 * x
    p, q, term = jnp.ones_like(x), jnp.zeros_like(x), jnp.ones_like(x)
    for k in range(1, 9):
        term = term * (mu - (2 * k - 1) ** 2) / (k * z)
        if k % 2:
            q = q + (term if k % 4 == 1 else -term)
        else:
            p = p + (-term if k % 4 == 2 else term)
    return p, q, x - (nu / 2 + 0.25) * jnp.pi


def _j(nu, x):
    """J_nu(x) for x >= 0 and real order nu (Bessel's integral, with Schlaefli's
    correction term for a non-integer order)."""
    small = jnp.minimum(x, _LARGE)
    zero, pi = jnp.zeros_like(x), jnp.full_like(x, jnp.pi)
    quad = _quad(lambda t: jnp.cos(nu * t - small[..., None] * jnp.sin(t)), zero, pi) / jnp.pi
    if nu != int(nu):
        top = jnp.arcsinh(60.0 / jnp.maximum(small, 1e-30))
        quad = quad - np.sin(nu * np.pi) / np.pi * _quad(
            lambda t: jnp.exp(-small[..., None] * jnp.sinh(t) - nu * t), zero, top)
    big = jnp.maximum(x, _LARGE)
    p, q, chi = _hankel(nu, big)
    asym = jnp.sqrt(2 / (jnp.pi * big)) * (p * jnp.cos(chi) - q * jnp.sin(chi))
    return jnp.where(x > _LARGE, asym, quad)


def _y(n, x):
    """Y_n(x) for integer n >= 0: NaN for x < 0, -inf at 0."""
    pos = jnp.where(x > 0, x, 1.0)
    small = jnp.minimum(pos, _LARGE)
    zero, pi = jnp.zeros_like(x), jnp.full_like(x, jnp.pi)
    first = _quad(lambda t: jnp.sin(small[..., None] * jnp.sin(t) - n * t), zero, pi)
    top = jnp.arcsinh(60.0 / small)
    sign = (-1.0) ** n
    second = _quad(lambda t: (jnp.exp(n * t) + sign * jnp.exp(-n * t))
                   * jnp.exp(-small[..., None] * jnp.sinh(t)), zero, top)
    quad = (first - second) / jnp.pi
    big = jnp.maximum(pos, _LARGE)
    p, q, chi = _hankel(n, big)
    asym = jnp.sqrt(2 / (jnp.pi * big)) * (p * jnp.sin(chi) + q * jnp.cos(chi))
    out = jnp.where(pos > _LARGE, asym, quad)
    return jnp.where(x > 0, out, jnp.where(x == 0, -jnp.inf, jnp.nan))


def _k_scaled(nu, x):
    """exp(x) K_nu(x) = ∫_0^∞ exp(-x (cosh t - 1)) cosh(nu t) dt, for x > 0."""
    pos = jnp.where(x > 0, x, 1.0)
    top = jnp.arccosh(1 + 80.0 / pos)
    out = _quad(lambda t: jnp.exp(-pos[..., None] * (jnp.cosh(t) - 1)) * jnp.cosh(nu * t),
                jnp.zeros_like(pos), top)
    return jnp.where(x > 0, out, jnp.where(x == 0, jnp.inf, jnp.nan))


def _k(nu, x):
    return _k_scaled(nu, x) * jnp.exp(-jnp.where(x > 0, x, 0.0))


def _airy_ai(x):
    # x > 0: Ai = sqrt(x/3)/pi K_{1/3}(zeta); x < 0: Ai(-z) = sqrt(z)/3 (J_{1/3} + J_{-1/3})
    z = jnp.abs(x)
    zeta = 2.0 / 3.0 * z ** 1.5
    safe = jnp.where(zeta > 0, zeta, 1.0)
    right = jnp.sqrt(z / 3) / jnp.pi * _k(1.0 / 3.0, safe)
    left = jnp.sqrt(z) / 3 * (_j(1.0 / 3.0, safe) + _j(-1.0 / 3.0, safe))
    at_zero = 0.355028053887817239
    return jnp.where(x > 0, right, jnp.where(x < 0, left, at_zero))


def _j0(x):
    x = _float(x)
    return _j(0, jnp.abs(x))


def _j1(x):
    x = _float(x)
    return jnp.sign(x) * _j(1, jnp.abs(x))


for _op, _fn in {
    aten.special_bessel_j0: _j0,
    aten.special_bessel_j1: _j1,
    aten.special_bessel_y0: lambda x: _y(0, _float(x)),
    aten.special_bessel_y1: lambda x: _y(1, _float(x)),
    aten.special_modified_bessel_k0: lambda x: _k(0, _float(x)),
    aten.special_modified_bessel_k1: lambda x: _k(1, _float(x)),
    aten.special_scaled_modified_bessel_k0: lambda x: _k_scaled(0, _float(x)),
    aten.special_scaled_modified_bessel_k1: lambda x: _k_scaled(1, _float(x)),
    aten.special_airy_ai: lambda x: _airy_ai(_float(x)),
}.items():
    lowering(_op.default)(_fn)
