"""A traced step with an implicit loop generates the whole continuation in one call, as one
compiled `while` loop: stop sequences end a sequence, `max_tokens` bounds every one, and the
loop ends when all are done. The "model" is a fixed map of the last token, so the expected
sequences are computed in plain Python."""
import json
import os
import subprocess
import sys

import pytest
import torch

import cerebras.pytorch as cstorch
from tests.conftest import ROOT

START, VOCAB, LENGTH = 0, 11, 12


def _next(token):
    return (token * 3 + 1) % VOCAB + 1     # never START


def _expected(prompt, stops=(), max_tokens=None):
    """The prompt continued by `_next` until it ends with a stop sequence, has max_tokens new
    tokens or is full; padded with START."""
    row = list(prompt)
    new = 0
    while len(row) < LENGTH and (max_tokens is None or new < max_tokens):
        row.append(_next(row[-1]))
        new += 1
        if any(len(s) <= len(row) and row[len(row) - len(s):] == list(s) for s in stops):
            break
    return row + [START] * (LENGTH - len(row))


def _prompts(*rows):
    return torch.tensor([list(r) + [START] * (LENGTH - len(r)) for r in rows])


def _stops(per_sequence, width=2, count=2):
    """(batch, count, width) stop sequences, each padded with START; missing rows: none."""
    out = torch.full((len(per_sequence), count, width), START)
    for b, stops in enumerate(per_sequence):
        for n, s in enumerate(stops):
            out[b, n, :len(s)] = torch.tensor(s)
    return out


def _generator(max_tokens=None, start_token=(START,)):
    @cstorch.trace
    @torch.no_grad()
    def step(input_ids, stops):
        index = cstorch.experimental.start_implicit_loop(input_ids, loop_dim=1)
        current = cstorch.experimental.get_loop_iteration_slice(input_ids, index)
        return cstorch.experimental.update_implicit_loop(
            input_tensor=input_ids, index_tensor=index, update_tensor=_next(current),
            stop_sequences_tensor=stops, start_token=list(start_token), max_tokens=max_tokens)
    return step


def test_one_call_generates_until_each_sequence_stops():
    cstorch.backend("CPU")
    step = _generator()
    prompts = [[2], [4, 5], [7, 3, 9]]
    # Sequence 0 runs 2 8 4 3 11 2 ...: it stops after "4 3"; sequence 1 (5 6 9 7 1 5 ...)
    # at its one-token stop 7; sequence 2 has none and fills its row.
    stops = _stops([[[4, 3]], [[10], [7]], []])
    out = step(_prompts(*prompts), stops).host()
    expected = [_expected(p, [[4, 3]] if b == 0 else [[10], [7]] if b == 1 else [])
                for b, p in enumerate(prompts)]
    assert out.tolist() == expected
    assert expected[0].count(START) > 0 and expected[1].count(START) > 0
    assert START not in expected[2]
    # A new call takes what it is given as the prompts: it continues each sequence.
    again = [[t for t in row if t != START] for row in expected]
    assert step(out, stops).host().tolist() == [
        _expected(p, [[4, 3]] if b == 0 else [[10], [7]] if b == 1 else [])
        for b, p in enumerate(again)]
    assert step.captures == 1


def test_stop_sequences_shared_by_every_sequence_and_max_tokens():
    cstorch.backend("CPU")
    step = _generator(max_tokens=4)
    prompts = [[2], [4, 5], [6]]
    stops = torch.tensor([[3, START], [1, 5]])      # (number, length): for every sequence
    out = step(_prompts(*prompts), stops).host()
    assert out.tolist() == [_expected(p, [[3], [1, 5]], max_tokens=4) for p in prompts]
    assert [LENGTH - row.count(START) - len(p) for row, p in zip(out.tolist(), prompts)] \
        == [3, 4, 4]


def test_the_generation_is_one_compiled_loop():
    cstorch.backend("CPU")
    step = _generator()
    seq = _prompts([2], [4, 5])
    out = step(seq, _stops([[], []])).host()
    assert out.tolist() == [_expected([2]), _expected([4, 5])]   # full rows after one call
    (program,) = [p for ps in step.programs.values() for p in ps]
    primitives = {e.primitive.name for e in program.compiled.jaxpr().jaxpr.eqns}
    assert "while" in primitives
    step(seq, _stops([[], []]))
    assert step.captures == 1


CSX_SCRIPT = r"""
import json, sys, tempfile
import cerebras.pytorch as cstorch
from tests.compat import test_implicit_loop_compiled as t
cstorch.backend("CSX", artifact_dir=tempfile.mkdtemp())
prompts = [[2], [4, 5], [6], [7, 3], [1], [2, 2], [3], [9]]
stops = t._stops([[[4, 3]]] + [[]] * 7)
print(json.dumps(t._generator(max_tokens=5)(t._prompts(*prompts), stops).host().tolist()))
"""


@pytest.mark.slow
def test_the_loop_on_an_emulated_wafer_of_eight_devices():
    """On the CSX backend over 8 emulated devices the loop, its stops and max_tokens work
    as on the CPU backend."""
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
           "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}
    proc = subprocess.run([sys.executable, "-c", CSX_SCRIPT], env=env, capture_output=True,
                          text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    prompts = [[2], [4, 5], [6], [7, 3], [1], [2, 2], [3], [9]]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [
        _expected(p, [[4, 3]] if b == 0 else [], max_tokens=5) for b, p in enumerate(prompts)]


def test_start_tokens_as_a_list_and_a_full_prompt():
    cstorch.backend("CPU")
    step = _generator(start_token=(START, 10))
    full = list(range(1, LENGTH + 1))
    seq = _prompts([2], full)
    out = step(seq, _stops([[], []])).host()
    assert out.tolist()[1] == full
    assert out.tolist()[0] == _expected([2])


def _capture_error(step, *args):
    cstorch.backend("CPU")
    with pytest.raises(ValueError) as info:
        step(*args)
    return str(info.value)


def test_the_loop_input_must_be_a_step_argument():
    @cstorch.trace
    def step(x):
        ids = x + 0
        index = cstorch.experimental.start_implicit_loop(ids, loop_dim=1)
        return cstorch.experimental.update_implicit_loop(ids, index, index, None, START)
    assert "tensor argument of the traced step" in _capture_error(step, _prompts([2]))


def test_the_step_must_return_the_updated_sequences():
    @cstorch.trace
    def step(ids):
        index = cstorch.experimental.start_implicit_loop(ids, loop_dim=1)
        return cstorch.experimental.update_implicit_loop(ids, index, index, None, START) + 1
    assert "must return the tensor update_implicit_loop" in _capture_error(step, _prompts([2]))


def test_a_loop_without_an_update_or_with_two():
    @cstorch.trace
    def start_only(ids):
        return cstorch.experimental.start_implicit_loop(ids, loop_dim=1)
    assert "never calls update_implicit_loop" in _capture_error(start_only, _prompts([2]))

    @cstorch.trace
    def twice(ids):
        index = cstorch.experimental.start_implicit_loop(ids, loop_dim=1)
        a = cstorch.experimental.update_implicit_loop(ids, index, index, None, START)
        return a, cstorch.experimental.update_implicit_loop(ids, index, index, None, START)
    assert "one implicit loop" in _capture_error(twice, _prompts([2]))

    @cstorch.trace
    def other_index(ids):
        cstorch.experimental.start_implicit_loop(ids, loop_dim=1)
        index = torch.zeros(1, 1, dtype=torch.int64)
        return cstorch.experimental.update_implicit_loop(ids, index, index, None, START)
    assert "the index it returned" in _capture_error(other_index, _prompts([2]))


@pytest.mark.parametrize("kwargs, message", [
    (dict(start_token=None), "needs `start_token`"),
    (dict(start_token=[]), "non-empty list of ints"),
    (dict(max_tokens=0), "positive int or None"),
    (dict(stop_sequences_tensor=torch.zeros(3, 1, 2, dtype=torch.int64)), "does not fit"),
    (dict(stop_sequences_tensor=torch.zeros(2, dtype=torch.int64)), "does not fit"),
])
def test_bad_loop_arguments(kwargs, message):
    @cstorch.trace
    def step(ids):
        index = cstorch.experimental.start_implicit_loop(ids, loop_dim=1)
        args = dict(stop_sequences_tensor=None, start_token=START, max_tokens=None)
        args.update(kwargs)
        return cstorch.experimental.update_implicit_loop(ids, index, index, **args)
    assert message in _capture_error(step, _prompts([2]))


def test_the_loop_runs_over_batch_by_length_sequences():
    @cstorch.trace
    def step(ids):
        index = cstorch.experimental.start_implicit_loop(ids, loop_dim=0)
        return cstorch.experimental.update_implicit_loop(ids, index, index, None, START)
    assert "(batch, length) along loop_dim 1" in _capture_error(step, _prompts([2]).T)


def test_a_loop_step_computes_no_gradients():
    backend = cstorch.backend("CPU")
    model = cstorch.compile(torch.nn.Embedding(VOCAB + 1, 1), backend)

    @cstorch.trace
    def step(ids):
        index = cstorch.experimental.start_implicit_loop(ids, loop_dim=1)
        current = cstorch.experimental.get_loop_iteration_slice(ids, index)
        model(current).sum().backward()
        return cstorch.experimental.update_implicit_loop(ids, index, current, None, START)
    with pytest.raises(ValueError, match="computes no gradients"):
        step(_prompts([2]))
