"""Model Zoo's own generation path (`model(batch, autoregressive=True)`: GPT-2's
`inference_step`, which LLaMA inherits, over `cstorch.experimental`'s implicit loop) in one
traced call, against greedy decoding of the same model run eagerly by torch: the model's
logits for the tokens so far, argmax, appended, until a stop sequence, `max_tokens` or the
full length."""
import copy

import pytest
import torch

import cerebras.pytorch as cstorch
from tests.modelzoo import common
from tests.modelzoo.common import SEQ, VOCAB

START = VOCAB - 1       # the padding token of the prompts
PROMPTS = [[5, 6, 7], [8], [1, 2, 3, 4, 5]]


def _eager_greedy(model, prompt, stops=(), max_tokens=None):
    """The sequence greedy decoding of `model` (plain torch) continues `prompt` to, padded."""
    row = list(prompt)
    with torch.no_grad():
        while len(row) < SEQ and (max_tokens is None or len(row) - len(prompt) < max_tokens):
            # The tokens so far, padded to the model's length (its attention takes no
            # single token); causal attention keeps the padding out of the last token's logits.
            ids = torch.tensor([row + [START] * (SEQ - len(row))], dtype=torch.int32)
            logits = model.model(input_ids=ids, attention_mask=torch.ones_like(ids))
            row.append(int(torch.argmax(logits[0, len(row) - 1])))
            if any(row[len(row) - len(s):] == list(s) for s in stops if len(s) <= len(row)):
                break
    return row + [START] * (SEQ - len(row))


def _batch(stops_per_sequence=((), (), ()), width=2):
    ids = torch.full((len(PROMPTS), SEQ), START, dtype=torch.int32)
    for b, p in enumerate(PROMPTS):
        ids[b, :len(p)] = torch.tensor(p)
    stops = torch.full((len(PROMPTS), 2, width), START, dtype=torch.int32)
    for b, seqs in enumerate(stops_per_sequence):
        for n, s in enumerate(seqs):
            stops[b, n, :len(s)] = torch.tensor(s)
    return {"input_ids": ids, "stop_sequences": stops,
            "rand_uniform": torch.zeros(len(PROMPTS), 1)}


def _generator(name, **config):
    """(one traced call of Model Zoo's generation path, the model, an eager copy of it)."""
    model = common.build(name, start_token=START, **config)
    model.eval()
    eager = copy.deepcopy(model)
    compiled = cstorch.compile(model, cstorch.backend("CPU"))

    @cstorch.trace
    @torch.no_grad()
    def generate(batch):
        return compiled(batch, autoregressive=True)

    return generate, model, eager


@pytest.mark.parametrize("name", ["gpt2", pytest.param("llama", marks=pytest.mark.slow)])
def test_generation_equals_eager_greedy_decoding(name):
    generate, _, eager = _generator(name)
    out = generate(_batch()).host()
    expected = [_eager_greedy(eager, p) for p in PROMPTS]
    assert all(START not in row[len(p):] for row, p in zip(expected, PROMPTS))  # rows fill up
    assert out.tolist() == expected
    assert generate.captures == 1


# Slow; tests/compat/test_implicit_loop_compiled.py checks the loop's stop rules quickly.
@pytest.mark.slow
def test_generation_stops_at_stop_sequences_and_max_tokens():
    generate, model, eager = _generator("gpt2")
    full = generate(_batch()).host().tolist()
    # Sequence 0 stops at its third new token, sequence 1 at the pair of its 4th and 5th
    # new tokens; sequence 2 has no stop sequence.
    stops = ([full[0][len(PROMPTS[0]) + 2:len(PROMPTS[0]) + 3]],
             [full[1][len(PROMPTS[1]) + 3:len(PROMPTS[1]) + 5]], [])
    out = generate(_batch(stops)).host()
    expected = [_eager_greedy(eager, p, s) for p, s in zip(PROMPTS, stops)]
    assert out.tolist() == expected
    new = [SEQ - row.count(START) - len(p) for row, p in zip(expected, PROMPTS)]
    assert new[0] <= 3 and new[1] <= 5 and new[2] == SEQ - len(PROMPTS[2])
    assert generate.captures == 1    # the stop sequences are an argument of the step

    model.max_tokens = 4             # Model Zoo's config value, read by its inference_step
    out = generate(_batch(stops)).host()
    assert out.tolist() == [_eager_greedy(eager, p, s, max_tokens=4)
                            for p, s in zip(PROMPTS, stops)]
