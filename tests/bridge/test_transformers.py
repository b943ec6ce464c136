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
    for g, w, n in zip(got[1:], want[1:], names):
        if w is None:
            continue
        # grads that are zero in exact arithmetic (biases before a softmax) are rounding noise
        _close(g, w, rtol=1e-3, atol_floor=1e-6)


@pytest.mark.xfail(reason="torch.export's run_decompositions fails on GPT-2's non-contiguous "
                          "view (PyTorch side, before bridge sees the graph)", strict=False)
def test_to_jax_on_exported_gpt2():
    model, ids, *_ = _setup("gpt2")
    model.config.use_cache = False
    ep = torch.export.export(model, (ids,), strict=False)
    fn, state = bridge.to_jax(ep)
    out = jax.jit(fn)(state, bridge.tensor_to_jax(ids))
    logits = out["logits"] if isinstance(out, dict) else getattr(out, "logits", out[0])
    with torch.no_grad():
        _close(logits, model(ids).logits)
