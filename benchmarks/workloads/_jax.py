"""JAX building blocks with PyTorch's math, for the hand-written peers. Parameters are
dicts keyed by the torch model's `named_parameters()` names."""
import math

import jax
import jax.numpy as jnp


def params_of(model):
    """(parameters, buffers) of a torch module as dicts of numpy arrays (int64 as int32)."""
    def host(t):
        a = t.detach().numpy().copy()
        return a.astype("int32") if a.dtype == "int64" else a
    return ({k: host(v) for k, v in model.named_parameters()},
            {k: host(v) for k, v in model.named_buffers()})


def linear(p, name, x, bias=True):
    y = x @ p[f"{name}.weight"].T
    return y + p[f"{name}.bias"] if bias else y


def layer_norm(p, name, x, eps=1e-5):
    mean = x.mean(-1, keepdims=True)
    var = jnp.square(x - mean).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * p[f"{name}.weight"] + p[f"{name}.bias"]


def causal_attention(q, k, v, heads):
    """softmax(q k^T / sqrt(d_head) + causal mask) v over `heads` heads; q, k, v (b, t, d)."""
    b, t, d = q.shape
    split = lambda z: z.reshape(b, t, heads, d // heads).transpose(0, 2, 1, 3)  # noqa: E731
    q, k, v = split(q), split(k), split(v)
    att = (q @ k.swapaxes(-2, -1)) / math.sqrt(d // heads)
    att = jnp.where(jnp.tril(jnp.ones((t, t), bool)), att, -jnp.inf)
    y = jax.nn.softmax(att, axis=-1) @ v
    return y.transpose(0, 2, 1, 3).reshape(b, t, d)


def cross_entropy(logits, labels):
    """Mean cross-entropy of (n, classes) logits against integer labels (n,)."""
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=1))


def next_token_loss(logits_fn, tokens):
    """examples.train_gpt.next_token_loss: predict each token from those before it."""
    logits = logits_fn(tokens[:, :-1])
    return cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
