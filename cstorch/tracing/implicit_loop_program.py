"""A traced step with an implicit loop (`cstorch.experimental.start_implicit_loop` /
`update_implicit_loop`) as one compiled loop, as a Cerebras system runs it.

The capture records the step's body once: it reads the sequences (a step argument, the
prompts padded with `start_token`) and returns them with one more token per sequence.
The program then runs that body in a `jax.lax.while_loop` whose state is the sequences
buffer: each iteration feeds the buffer back as the argument, writes the tokens of the
sequences still generating, and marks a sequence done when it ends with one of its stop
sequences, has `max_tokens` new tokens, or is full. The loop ends when every sequence is
done; one call of the step generates the whole continuation.

`recording` collects what the implicit-loop functions were called with during the
capture; `Recorder.finish` checks it and names the extra outputs the loop needs from the
body (the position each iteration wrote at, the stop sequences); `around` wraps the
lowered body in the loop.
"""
import contextlib
import contextvars
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import torch

_recording = contextvars.ContextVar("cstorch_implicit_loop", default=None)


@dataclass
class LoopSpec:
    """Where the loop's tensors are among the body's inputs and outputs."""
    input_position: int     # among the step's tensor arguments: the sequences buffer
    result_position: int    # among the step's tensor outputs: the buffer with new tokens
    outputs: int            # how many tensor outputs the step has (results, closures)
    has_stops: bool         # whether an extra output after the index holds stop sequences
    start_tokens: tuple     # the padding token(s)
    max_tokens: int | None


@dataclass
class _Update:
    input: torch.Tensor
    index: torch.Tensor
    result: torch.Tensor
    stops: torch.Tensor | None
    start_tokens: tuple
    max_tokens: int | None


class Recorder:
    """The implicit-loop calls of one capture."""

    def __init__(self):
        self.starts: list = []    # (input, index)
        self.updates: list = []

    def note_start(self, input_tensor, index):
        self.starts.append((input_tensor, index))

    def note_update(self, input_tensor, index, result, stops, start_token, max_tokens):
        if start_token is None:
            raise ValueError("update_implicit_loop: a traced step's loop needs `start_token`, "
                             "the token the prompts are padded with (an int or a list of "
                             "ints), to tell generated tokens from padding")
        tokens = (start_token,) if isinstance(start_token, int) else tuple(start_token)
        if not tokens or not all(isinstance(t, int) for t in tokens):
            raise ValueError(f"update_implicit_loop: start_token must be an int or a non-empty "
                             f"list of ints, got {start_token!r}")
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
            raise ValueError(f"update_implicit_loop: max_tokens must be a positive int or None, "
                             f"got {max_tokens!r}")
        # Sequences of another rank are refused by `finish`, which checks them first.
        if stops is not None and input_tensor.dim() == 2:
            if stops.dim() not in (2, 3) or (stops.dim() == 3
                                             and stops.shape[0] != input_tensor.shape[0]):
                raise ValueError(
                    f"update_implicit_loop: stop_sequences_tensor of shape "
                    f"{tuple(stops.shape)} does not fit sequences of shape "
                    f"{tuple(input_tensor.shape)}: give (batch, number of stop sequences, "
                    f"their length) or (number, length) for every sequence alike, each stop "
                    f"sequence padded with start_token")
        self.updates.append(_Update(input_tensor, index, result, stops, tokens, max_tokens))

    def finish(self, inputs, outs, grads_out, micro):
        """(LoopSpec, extra outputs) for a step that ran an implicit loop, else (None, [])."""
        if not self.starts and not self.updates:
            return None, []
        if not self.updates:
            raise ValueError("start_implicit_loop was called in a traced step that never calls "
                             "update_implicit_loop: the loop has no update; call "
                             "update_implicit_loop with the index start_implicit_loop returned")
        if len(self.updates) > 1 or len(self.starts) > 1:
            raise ValueError(f"a traced step may run one implicit loop: it called "
                             f"start_implicit_loop {len(self.starts)} and update_implicit_loop "
                             f"{len(self.updates)} times")
        update = self.updates[0]
        if not self.starts or update.index is not self.starts[0][1] \
                or update.input is not self.starts[0][0]:
            raise ValueError("update_implicit_loop must be given the tensor start_implicit_loop "
                             "was given and the index it returned, in the same traced step")
        if micro is not None:
            raise ValueError("a traced step with an implicit loop cannot be micro-batched: set "
                             "cstorch.backends.csx.performance.micro_batch_size = None")
        if grads_out:
            raise ValueError("a traced step with an implicit loop (generation) computes no "
                             "gradients: run backward passes in a step of their own")
        k = next((i for i, t in enumerate(inputs) if t is update.input), None)
        if k is None:
            raise ValueError("start_implicit_loop must be given a tensor argument of the traced "
                             "step itself (the prompts padded with start_token), which each "
                             "iteration of the loop replaces with the sequences so far; it was "
                             "given a tensor computed inside the step")
        if update.input.dim() != 2 or getattr(update.index, "_cstorch_loop_dim", 1) != 1:
            raise ValueError(f"a traced step's implicit loop runs over sequences of shape "
                             f"(batch, length) along loop_dim 1; got shape "
                             f"{tuple(update.input.shape)}")
        j = next((i for i, t in enumerate(outs) if t is update.result), None)
        if j is None:
            raise ValueError("the traced step must return the tensor update_implicit_loop "
                             "returned (the sequences with their new tokens): the loop feeds "
                             "it back as the next iteration's sequences")
        extras = [update.index]
        if update.stops is not None:
            extras.append(update.stops)
        spec = LoopSpec(k, j, len(outs), update.stops is not None, update.start_tokens,
                        update.max_tokens)
        return spec, extras


@contextlib.contextmanager
def recording():
    """Collect the implicit-loop calls of the capture in progress."""
    recorder = Recorder()
    token = _recording.set(recorder)
    try:
        yield recorder
    finally:
        _recording.reset(token)


def current() -> Recorder | None:
    """The recorder of the capture in progress, or None outside a capture."""
    return _recording.get()


def _stop_matched(buf, pos, stops, start_tokens):
    """Per sequence, whether its tokens up to `pos` end with one of its stop sequences. A
    stop sequence is its tokens before its first padding token; one that starts with
    padding is none."""
    batch, length = buf.shape
    if stops.ndim == 2:
        stops = jnp.broadcast_to(stops, (batch,) + stops.shape)
    stops = stops.astype(buf.dtype)
    is_pad = jnp.zeros(stops.shape, bool)
    for t in start_tokens:
        is_pad = is_pad | (stops == t)
    # The length of each stop sequence: its tokens before the first padding.
    lengths = jnp.sum(jnp.cumprod(~is_pad, axis=-1), axis=-1)         # (B, N)
    first = pos[:, None] - lengths + 1                                   # (B, N)
    matched = (lengths > 0) & (first >= 0)
    for t in range(stops.shape[-1]):
        at = jnp.clip(first + t, 0, length - 1)
        token = jnp.take_along_axis(buf, at, axis=1)                     # (B, N)
        matched = matched & ((t >= lengths) | (token == stops[:, :, t]))
    return jnp.any(matched, axis=1)


class _Looped:
    """The lowered body run as the loop; `checked` and `index_checks` are the body's."""

    def __init__(self, body, spec: LoopSpec, n_state: int, first_input: int):
        self.body, self.spec = body, spec
        self.n_state, self.first_input = n_state, first_input

    def __getattr__(self, name):
        return getattr(self.body, name)

    def __call__(self, *args, key=None):
        spec, n = self.spec, self.n_state
        k = self.first_input + spec.input_position
        j = n + spec.result_position          # no gradient outputs: checked by finish
        extra = n + spec.outputs
        n_extra = 1 + spec.has_stops
        buf0 = args[k]
        batch, length = buf0.shape

        def iteration(state, buf, it):
            a = list(args)
            a[:n], a[k] = state, buf
            # Random ops draw new numbers in every iteration, as in every step.
            it_key = None if key is None else (
                lambda: jax.random.fold_in(key() if callable(key) else key, it))
            return self.body(*a, key=it_key)

        def body(carry):
            it, state, buf, count, done, _ = carry
            outs = iteration(state, buf, it)
            active = ~done
            new = jnp.where(active[:, None], outs[j].astype(buf.dtype), buf)
            pos = outs[extra].reshape(batch).astype(jnp.int32) + 1
            count = count + active.astype(jnp.int32)
            finished = pos >= length - 1      # full: the last position is written
            if spec.max_tokens is not None:
                finished = finished | (count >= spec.max_tokens)
            if spec.has_stops:
                finished = finished | _stop_matched(new, pos, outs[extra + 1], spec.start_tokens)
            done = done | (active & finished)
            rest = outs[n:extra] + outs[extra + n_extra:]
            rest[spec.result_position] = new
            return it + 1, list(outs[:n]), new, count, done, rest

        def cond(carry):
            it, _, _, _, done, _ = carry
            return (it < length) & ~jnp.all(done)

        shapes = jax.eval_shape(lambda: iteration(list(args[:n]), buf0, jnp.int32(0)))
        rest0 = [jnp.zeros(s.shape, s.dtype) for s in shapes[n:extra] + shapes[extra + n_extra:]]
        rest0[spec.result_position] = buf0
        carry = (jnp.int32(0), list(args[:n]), buf0, jnp.zeros(batch, jnp.int32),
                 jnp.zeros(batch, bool), rest0)
        _, state, _, _, _, rest = jax.lax.while_loop(cond, body, carry)
        return list(state) + list(rest)


def around(lowered, spec: LoopSpec, n_state: int, first_input: int):
    """The lowered step body run as the implicit loop: the same arguments and outputs."""
    return _Looped(lowered, spec, n_state, first_input)
