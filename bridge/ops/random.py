"""Random ops, drawing from a JAX PRNG key threaded through the step.

Each random node of a graph gets its own key, folded from the step's key with the node's
position in the graph, so a step is reproducible from its key alone and two dropout
layers never share a mask.
"""
import contextlib
import contextvars

import jax
import jax.numpy as jnp
import torch

from bridge.convert import to_jax_dtype
from bridge.ops.registry import lowering

aten = torch.ops.aten
_keys = contextvars.ContextVar("bridge_random_keys", default=None)


class KeyStream:
    """Keys for the random ops of one lowered graph. `key` may be a function that makes
    the key, so a graph without random ops never computes one."""

    def __init__(self, key):
        self.key = key
        self.count = 0

    def materialize(self):
        """Make the key now, outside any loop body whose trace it must not belong to."""
        if callable(self.key):
            self.key = self.key()

    def next(self):
        self.materialize()
        self.count += 1
        return jax.random.fold_in(self.key, self.count)


@contextlib.contextmanager
def key_stream(key):
    stream = KeyStream(key)
    token = _keys.set(stream)
    try:
        yield stream
    finally:
        _keys.reset(token)


def next_key():
    stream = _keys.get()
    if stream is None:
        raise RuntimeError("a random op was lowered without a PRNG key; pass `key=` to the lowered function")
    return stream.next()


def _float_dtype(dtype):
    return to_jax_dtype(dtype) if dtype is not None else jnp.float32


@lowering(aten.bernoulli.p)
def bernoulli_p(x, p=0.5, generator=None):
    return jax.random.bernoulli(next_key(), p, x.shape).astype(x.dtype)


@lowering(aten.bernoulli.default)
def bernoulli(x, generator=None):
    return jax.random.bernoulli(next_key(), x, x.shape).astype(x.dtype)


@lowering(aten.bernoulli.Tensor)
def bernoulli_tensor(x, p, generator=None):
    return jax.random.bernoulli(next_key(), jnp.broadcast_to(p, x.shape), x.shape).astype(x.dtype)


@lowering(aten.rand.default)
def rand(size, dtype=None, layout=None, device=None, pin_memory=None, generator=None):
    return jax.random.uniform(next_key(), tuple(size), _float_dtype(dtype))


@lowering(aten.randn.default)
def randn(size, dtype=None, layout=None, device=None, pin_memory=None, generator=None):
    return jax.random.normal(next_key(), tuple(size), _float_dtype(dtype))


@lowering(aten.rand_like.default)
def rand_like(x, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jax.random.uniform(next_key(), x.shape, to_jax_dtype(dtype) if dtype else x.dtype)


@lowering(aten.randn_like.default)
def randn_like(x, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jax.random.normal(next_key(), x.shape, to_jax_dtype(dtype) if dtype else x.dtype)


@lowering(aten.randint.low)
def randint_low(low, high, size, dtype=None, layout=None, device=None, pin_memory=None, generator=None):
    dt = to_jax_dtype(dtype if dtype is not None else torch.int64)
    # ATen allows a float dtype (integers stored as floats); jax draws integers only
    draw_dt = dt if jnp.issubdtype(dt, jnp.integer) else jnp.int32
    return jax.random.randint(next_key(), tuple(size), low, high, draw_dt).astype(dt)


@lowering(aten.randint.default)
def randint(high, size, dtype=None, layout=None, device=None, pin_memory=None, generator=None):
    return randint_low(0, high, size, dtype)


@lowering(aten.randperm.default)
def randperm(n, dtype=torch.int64, layout=None, device=None, pin_memory=None, generator=None):
    return jax.random.permutation(next_key(), n).astype(to_jax_dtype(dtype or torch.int64))


@lowering(aten.uniform.default)
def uniform(x, low=0.0, high=1.0, generator=None):
    return jax.random.uniform(next_key(), x.shape, x.dtype, low, high)


@lowering(aten.normal.Tensor_Tensor)
def normal_tt(mean, std, generator=None):
    shape = jnp.broadcast_shapes(mean.shape, std.shape)
    return mean + std * jax.random.normal(next_key(), shape, jnp.result_type(mean, std))


@lowering(aten.normal.float_Tensor)
def normal_ft(mean, std, generator=None):
    return mean + std * jax.random.normal(next_key(), std.shape, std.dtype)


@lowering(aten.normal.Tensor_float)
def normal_tf(mean, std=1.0, generator=None):
    return mean + std * jax.random.normal(next_key(), mean.shape, mean.dtype)


@lowering(aten.normal.float_float)
def normal_ff(mean, std, size, generator=None, dtype=None, layout=None, device=None, pin_memory=None):
    return mean + std * jax.random.normal(next_key(), tuple(size), _float_dtype(dtype))


@lowering(aten.normal_functional.default)
def normal_functional(x, mean=0.0, std=1.0, generator=None):
    return mean + std * jax.random.normal(next_key(), x.shape, x.dtype)


@lowering(aten.native_dropout.default)
def native_dropout(x, p, train):
    if not train or p == 0:
        return x, jnp.ones(x.shape, jnp.bool_)
    keep = jax.random.bernoulli(next_key(), 1.0 - p, x.shape)
    return jnp.where(keep, x / (1.0 - p), 0).astype(x.dtype), keep


@lowering(aten.rrelu_with_noise_functional.default)
def rrelu_with_noise(x, noise, lower=0.125, upper=1 / 3, training=False, generator=None):
    # Training draws a slope per negative element and returns it as the new noise (ones
    # where x >= 0), as ATen's kernel writes it; evaluation uses the mean slope.
    if not training:
        return jnp.where(x >= 0, x, x * ((lower + upper) / 2)), noise
    slope = jax.random.uniform(next_key(), x.shape, jnp.float32, lower, upper).astype(x.dtype)
    slope = jnp.where(x >= 0, 1, slope).astype(x.dtype)
    return x * slope, slope


@lowering(aten.randint_like.default, aten.randint_like.low_dtype)
def randint_like(x, low_or_high, high=None, dtype=None, layout=None, device=None,
                 pin_memory=None, memory_format=None):
    low, high = (0, low_or_high) if high is None else (low_or_high, high)
    dt = to_jax_dtype(dtype) if dtype is not None else x.dtype
    return jax.random.randint(next_key(), x.shape, low, high).astype(dt)


@lowering(aten.multinomial.default)
def multinomial(probs, num_samples, replacement=False, generator=None):
    logits = jnp.log(probs)
    shape = probs.shape[:-1] + (num_samples,)
    if replacement:
        return jax.random.categorical(next_key(), logits[..., None, :], shape=shape)
    # without replacement: the top-k of Gumbel-perturbed logits
    g = jax.random.gumbel(next_key(), probs.shape)
    return jax.lax.top_k(logits + g, num_samples)[1]
