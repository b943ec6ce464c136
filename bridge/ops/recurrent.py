"""Recurrent layers (`nn.LSTM`, `nn.GRU`, `nn.RNN`) as one op per layer and direction,
lowered to a `jax.lax.scan` over time.

PyTorch's own CPU path cannot be captured as is: `aten.lstm` picks oneDNN's
`mkldnn_rnn_layer`, an opaque kernel. With oneDNN off it unrolls one cell per time step, so
the graph, the capture time and XLA's compile time all grow with the sequence length.
Capture therefore routes the four
`torch._VF` entry points that `nn.RNNBase` calls (see `route`) to `recurrent`, which keeps
PyTorch's layer structure (layers, directions, dropout between layers through the usual
`torch.dropout`, so it draws from the step's traced RNG like any other dropout) and hands
each layer and direction to `bridge::rnn_layer`: one graph node whatever the length.

`bridge::rnn_layer` returns the hidden state of every step and, for LSTM, the cell state
of every step (as cuDNN and oneDNN keep a workspace). Its backward op uses them to start
each step from its saved state, so the backward is one reverse scan: no forward is
recomputed. JAX differentiates the gates (`_gates`), so their math is written once.
Double backward through an RNN is not supported.

Packed sequences (`nn.utils.rnn.PackedSequence`) are left to PyTorch: their batch sizes are
values, not shapes, which a traced step does not know.
"""

import jax
import jax.numpy as jnp
import torch
from torch import Tensor

from bridge.convert import jax_to_tensor, tensor_to_jax
from bridge.ops.registry import lowering

_MODES = ("lstm", "gru", "rnn_tanh", "rnn_relu")


# ---- one layer in one direction, in JAX ------------------------------------------------

def _gates(mode, xp_t, gh_t, h, c):
    """The state after one step, from the step's two projections: of its input,
    xp_t = x_t W_ih^T + b_ih, and of the previous output, gh_t = h W_hh^T + b_hh. `h`, `c` are
    the previous state (`c` is None except for LSTM). An LSTM's h is returned before its
    projection W_hr. Gate order and formulas are PyTorch's (nn.LSTM, nn.GRU, nn.RNN docs)."""
    if mode == "lstm":
        i, f, g, o = jnp.split(xp_t + gh_t, 4, axis=-1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        return jax.nn.sigmoid(o) * jnp.tanh(c), c
    if mode == "gru":
        # The reset gate scales W_hn h + b_hn, so b_hh cannot be folded into b_ih.
        xr, xz, xn = jnp.split(xp_t, 3, axis=-1)
        hr, hz, hn = jnp.split(gh_t, 3, axis=-1)
        r = jax.nn.sigmoid(xr + hr)
        z = jax.nn.sigmoid(xz + hz)
        n = jnp.tanh(xn + r * hn)
        return (1 - z) * n + z * h, None
    pre = xp_t + gh_t
    return (jnp.tanh(pre) if mode == "rnn_tanh" else jax.nn.relu(pre)), None


def _linear(x, w, b=None):
    y = x @ w.T
    return y if b is None else y + b


def _started_from(seq, initial, reverse):
    """The state each step started from: the previous step's (in processing order), or
    `initial` for the first step processed."""
    if reverse:
        return jnp.concatenate([seq[1:], initial[None]], axis=0)
    return jnp.concatenate([initial[None], seq[:-1]], axis=0)


def _empty(like):
    return jnp.zeros((0,), like.dtype)


def _layer_forward(x, hx, cx, w_ih, w_hh, b_ih, b_hh, w_hr, mode, reverse):
    def body(state, xp_t):
        h, c = state
        h, c = _gates(mode, xp_t, _linear(h, w_hh, b_hh), h, c)
        if w_hr is not None:
            h = h @ w_hr.T
        return (h, c), (h, c)

    # The input projection is not recurrent: one matmul over all steps, outside the loop.
    _, (hs, cs) = jax.lax.scan(body, (hx, cx), _linear(x, w_ih, b_ih), reverse=reverse)
    return hs, (cs if cs is not None else _empty(x))


def _layer_backward(grad_out, grad_cells, x, hx, cx, w_ih, w_hh, b_ih, b_hh, w_hr, out, cells,
                    mode, reverse):
    # With every step's starting state saved, both projections of every step are known up
    # front; only the state's gradient is sequential. The loop body is the gates' VJP and
    # one matmul (two with a projection); weight gradients are matmuls over all steps after.
    lstm = mode == "lstm"
    h_prev = _started_from(out, hx, reverse)
    c_prev = _started_from(cells, cx, reverse) if lstm else None
    xp = _linear(x, w_ih, b_ih)
    gh = _linear(h_prev, w_hh, b_hh)

    def body(carry, step):
        dh, dc = carry
        xp_t, gh_t, h_t, c_t, dout_t, dcells_t = step
        # A step's state reaches the loss directly (its output) and through later steps.
        dh = dh + dout_t
        if lstm:
            dc = dc + dcells_t
        (h_raw, _), vjp = jax.vjp(lambda *a: _gates(mode, *a), xp_t, gh_t, h_t, c_t)
        dxp_t, dgh_t, dh_direct, dc = vjp((dh if w_hr is None else dh @ w_hr, dc))
        projection = (dh, h_raw) if w_hr is not None else None
        return (dh_direct + dgh_t @ w_hh, dc), (dxp_t, dgh_t, projection)

    zeros = (jnp.zeros_like(hx), jnp.zeros_like(cx) if lstm else None)
    (dhx, dcx), (dxp, dgh, projection) = jax.lax.scan(
        body, zeros, (xp, gh, h_prev, c_prev, grad_out, grad_cells if lstm else None),
        reverse=not reverse)
    over_steps = lambda d, v: jnp.einsum("tbo,tbi->oi", d, v)
    grads = (dxp @ w_ih, dhx, dcx,
             over_steps(dxp, x), over_steps(dgh, h_prev),
             dxp.sum((0, 1)) if b_ih is not None else None,
             dgh.sum((0, 1)) if b_hh is not None else None,
             over_steps(*projection) if w_hr is not None else None)
    return tuple(g if g is not None else _empty(x) for g in grads)


# ---- the ops: what the captured graph holds -------------------------------------------

# The eager kernels (the ops on real tensors, outside any capture) run the lowerings.
def _to_jax(t):
    return None if t is None else tensor_to_jax(t)


def _to_torch(arrays):
    return tuple(jax_to_tensor(a) for a in arrays)


@torch.library.custom_op("bridge::rnn_layer", mutates_args=())
def rnn_layer(input: Tensor, hx: Tensor, cx: Tensor | None, w_ih: Tensor, w_hh: Tensor,
              b_ih: Tensor | None, b_hh: Tensor | None, w_hr: Tensor | None,
              mode: str, reverse: bool) -> tuple[Tensor, Tensor]:
    """One direction of one recurrent layer over a time-major `input` (T, B, I), from state
    `hx` (B, H_out) and, for LSTM, `cx` (B, H). Returns every step's output (T, B, H_out) in
    time order (`reverse` only changes the order they are computed in) and, for LSTM, every
    step's cell state (T, B, H); other modes return an empty tensor there."""
    tensors = (input, hx, cx, w_ih, w_hh, b_ih, b_hh, w_hr)
    return _to_torch(_layer_forward(*map(_to_jax, tensors), mode, reverse))


@rnn_layer.register_fake
def _(input, hx, cx, w_ih, w_hh, b_ih, b_hh, w_hr, mode, reverse):
    out = input.new_empty((input.shape[0], input.shape[1], hx.shape[-1]))
    cells = input.new_empty((input.shape[0], *cx.shape)) if cx is not None else input.new_empty(0)
    return out, cells


@torch.library.custom_op("bridge::rnn_layer_backward", mutates_args=())
def rnn_layer_backward(grad_out: Tensor, grad_cells: Tensor, input: Tensor, hx: Tensor,
                       cx: Tensor | None, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor | None,
                       b_hh: Tensor | None, w_hr: Tensor | None, out: Tensor, cells: Tensor,
                       mode: str, reverse: bool
                       ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Gradients of `rnn_layer`'s tensor inputs in order (input, hx, cx, w_ih, w_hh, b_ih,
    b_hh, w_hr); an input that was None gets an empty tensor."""
    tensors = (grad_out, grad_cells, input, hx, cx, w_ih, w_hh, b_ih, b_hh, w_hr, out, cells)
    return _to_torch(_layer_backward(*map(_to_jax, tensors), mode, reverse))


@rnn_layer_backward.register_fake
def _(grad_out, grad_cells, input, hx, cx, w_ih, w_hh, b_ih, b_hh, w_hr, out, cells, mode,
      reverse):
    return tuple(torch.empty_like(t) if t is not None else input.new_empty(0)
                 for t in (input, hx, cx, w_ih, w_hh, b_ih, b_hh, w_hr))


def _setup_context(ctx, inputs, output):
    *tensors, ctx.mode, ctx.reverse = inputs
    ctx.save_for_backward(*tensors, *output)


def _backward(ctx, grad_out, grad_cells):
    saved = ctx.saved_tensors
    grads = torch.ops.bridge.rnn_layer_backward(grad_out, grad_cells, *saved, ctx.mode,
                                                ctx.reverse)
    return (*(g if t is not None else None for g, t in zip(grads, saved[:8])), None, None)


rnn_layer.register_autograd(_backward, setup_context=_setup_context)


@lowering(torch.ops.bridge.rnn_layer.default)
def rnn_layer_lowering(input, hx, cx, w_ih, w_hh, b_ih, b_hh, w_hr, mode, reverse):
    return _layer_forward(input, hx, cx, w_ih, w_hh, b_ih, b_hh, w_hr, mode, reverse)


@lowering(torch.ops.bridge.rnn_layer_backward.default)
def rnn_layer_backward_lowering(*args):
    return _layer_backward(*args)


# ---- the layers: torch._VF.lstm & co. on top of the op --------------------------------

def recurrent(mode, input, hx, params, has_biases, num_layers, dropout, train, bidirectional,
              batch_first):
    """`torch._VF.<mode>` for a padded (not packed) input: the same arguments and results,
    built from `bridge::rnn_layer`. `hx` is (h0, c0) for LSTM, h0 otherwise."""
    x = input.transpose(0, 1) if batch_first else input
    h0, c0 = hx if mode == "lstm" else (hx, None)
    directions = 2 if bidirectional else 1
    per_layer = len(params) // (num_layers * directions)
    h_n, c_n = [], []
    for layer in range(num_layers):
        if layer and dropout and train:
            x = torch.dropout(x, dropout, True)
        outs = []
        for d in range(directions):
            k = layer * directions + d
            w = list(params[k * per_layer:(k + 1) * per_layer])
            b_ih, b_hh = (w[2], w[3]) if has_biases else (None, None)
            # Only LSTM weights come in threes or fives: the last one is the projection.
            w_hr = w[-1] if len(w) in (3, 5) else None
            out, cells = torch.ops.bridge.rnn_layer(
                x, h0[k], None if c0 is None else c0[k], w[0], w[1], b_ih, b_hh, w_hr, mode,
                d == 1)
            last = 0 if d == 1 else -1
            outs.append(out)
            h_n.append(out[last])
            if c0 is not None:
                c_n.append(cells[last])
        x = outs[0] if directions == 1 else torch.cat(outs, -1)
    output = x.transpose(0, 1) if batch_first else x
    if mode == "lstm":
        return output, torch.stack(h_n), torch.stack(c_n)
    return output, torch.stack(h_n)


_VF_FUNCTIONS = [(getattr(torch._VF, mode), mode) for mode in _MODES]


def route(func, args, kwargs):
    """`recurrent` bound to `args` when `func(*args, **kwargs)` is a padded-input call of
    `torch._VF.lstm/gru/rnn_tanh/rnn_relu`, else None. The packed overloads take
    `batch_sizes` as their second argument, which puts the weight list where the padded
    ones have `has_biases`."""
    mode = next((m for f, m in _VF_FUNCTIONS if f is func), None)
    if mode is None or kwargs or len(args) != 9 or not isinstance(args[3], bool):
        return None
    return lambda: recurrent(mode, *args)
