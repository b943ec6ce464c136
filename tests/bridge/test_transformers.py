"""Forward (and forward+backward) parity of small random Hugging Face models."""
import os

import jax
import numpy as np
import pytest
import torch

import bridge

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")


def _gpt2():
    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=32,
                                  attn_pdrop=0.0, embd_pdrop=0.0, resid_pdrop=0.0)
    return transformers.GPT2LMHeadModel(cfg)


def _bert():
    cfg = transformers.BertConfig(num_hidden_layers=2, num_attention_heads=2, hidden_size=32,
                                  intermediate_size=64, vocab_size=64, max_position_embeddings=32,
                                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return transformers.BertForMaskedLM(cfg)


def _llama():
    cfg = transformers.LlamaConfig(num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, hidden_size=32, intermediate_size=64,
                                   vocab_size=64, max_position_embeddings=32)
    return transformers.LlamaForCausalLM(cfg)


MODELS = {"gpt2": _gpt2, "bert": _bert, "llama": _llama}


def _setup(name):
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    ids = torch.randint(0, 64, (2, 8))
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    names = list(params)
    return model, ids, params, buffers, names


def _forward(model, names, buffers):
    def fn(ids, *weights):
        state = dict(zip(names, weights)) | buffers
        out = torch.func.functional_call(model, state, (ids,))
        return [out.logits]
    return fn


def _close(got, want, rtol=1e-4, atol_floor=0.0):
    want = want.detach().numpy()
    scale = np.abs(want).max()
    np.testing.assert_allclose(np.asarray(got), want, rtol=rtol,
                               atol=max(rtol * scale, atol_floor))


@pytest.mark.parametrize("name", list(MODELS))
def test_forward_matches_eager(name):
    model, ids, params, buffers, names = _setup(name)
    fn = _forward(model, names, buffers)
    gm = bridge.capture(fn, [ids, *params.values()])
    lowered = jax.jit(bridge.lower(gm))
    got = lowered(bridge.tensor_to_jax(ids), *[bridge.tensor_to_jax(p) for p in params.values()])
    with torch.no_grad():
        want = model(ids).logits
    _close(got[0], want)


@pytest.mark.parametrize("name", list(MODELS))
def test_forward_backward_matches_eager(name):
    model, ids, params, buffers, names = _setup(name)
    forward = _forward(model, names, buffers)

    def step(ids, *weights):
        logits = forward(ids, *weights)[0]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 64), ids.reshape(-1))
        loss.backward()
        return [loss] + [w.grad for w in weights]
    flat = [ids, *params.values()]
    gm = bridge.capture(step, flat, [False] + [True] * len(params))
    got = jax.jit(bridge.lower(gm))(*[bridge.tensor_to_jax(t) for t in flat])
    want = step(ids, *[p.detach().clone().requires_grad_(True) for p in params.values()])
    _close(got[0], want[0])
    for g, w, _n in zip(got[1:], want[1:], names):
        if w is None:
            continue
        # grads that are zero in exact arithmetic (biases before a softmax) are rounding noise
        _close(g, w, rtol=1e-3, atol_floor=1e-6)


def test_to_jax_on_exported_gpt2():
    model, ids, *_ = _setup("gpt2")
    model.config.use_cache = False
    ep = torch.export.export(model, (ids,), strict=False)
    fn, state = bridge.to_jax(ep)
    out = jax.jit(fn)(state, bridge.tensor_to_jax(ids))
    logits = out["logits"] if isinstance(out, dict) else getattr(out, "logits", out[0])
    with torch.no_grad():
        _close(logits, model(ids).logits)


def _tiny(name):
    """A 2-layer, hidden-32, vocab-100 model in train mode (no dropout), for training steps."""
    vocab = 100
    if name == "gpt2":
        cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=vocab,
                                      n_positions=16, attn_pdrop=0.0, embd_pdrop=0.0,
                                      resid_pdrop=0.0, use_cache=False)
        return transformers.GPT2LMHeadModel(cfg)
    if name == "bert":
        cfg = transformers.BertConfig(num_hidden_layers=2, num_attention_heads=2, hidden_size=32,
                                      intermediate_size=64, vocab_size=vocab,
                                      max_position_embeddings=16, hidden_dropout_prob=0.0,
                                      attention_probs_dropout_prob=0.0)
        return transformers.BertForMaskedLM(cfg)
    cfg = transformers.LlamaConfig(num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, hidden_size=32, intermediate_size=64,
                                   vocab_size=vocab, max_position_embeddings=16, use_cache=False)
    return transformers.LlamaForCausalLM(cfg)


def _rel(got, want, floor=0.0):
    # `floor` absorbs parameters that are zero in exact arithmetic: an attention key bias
    # gets only rounding-noise gradients (softmax is shift-invariant), so it stays ~1e-14.
    got, want = got.detach().double(), want.detach().double()
    return float((got - want).abs().max() / max(float(want.abs().max()), floor, 1e-12))


@pytest.mark.parametrize("name", list(MODELS))
def test_traced_training_step_matches_eager(name):
    """Two `@cstorch.trace` SGD steps on the model's own `labels=` loss equal eager PyTorch.

    SGD without momentum is the reference because its update is the same formula in
    cstorch and torch; cstorch's AdamW puts eps outside the bias correction (as the real
    package does), so it is not bit-for-bit torch.optim.AdamW.
    """
    import copy

    import cerebras.pytorch as cstorch

    torch.manual_seed(0)
    model = _tiny(name).train()
    reference = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, 100, (2, 8), generator=gen) for _ in range(2)]
    lr, weight_decay = 0.1, 0.01

    cstorch.backend("CPU")
    compiled = cstorch.compile(model)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=lr, weight_decay=weight_decay)

    @cstorch.trace
    def step(ids):
        loss = compiled(input_ids=ids, labels=ids).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    ref_opt = torch.optim.SGD(reference.parameters(), lr=lr, weight_decay=weight_decay)
    for ids in batches:
        loss = step(ids)
        ref_loss = reference(input_ids=ids, labels=ids).loss
        ref_opt.zero_grad()
        ref_loss.backward()
        ref_opt.step()
        assert _rel(loss, ref_loss) < 1e-4
    assert step.captures == 1
    ours, theirs = model.state_dict(), reference.state_dict()
    assert ours.keys() == theirs.keys()
    for key in theirs:
        assert _rel(ours[key], theirs[key], floor=1e-4) < 1e-4, key
