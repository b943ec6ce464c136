"""Model Zoo's GPT-2 and LLaMA, imported from `../shared/modelzoo/src` as its users run them,
built tiny from their own config classes, with the batches its GPT data processors make.
Everything Model Zoo's modules import comes with the `modelzoo` extra."""
import importlib
import os
import sys
import warnings

import numpy as np
import torch

from tests.conftest import SHARED

MODELZOO_SRC = os.path.join(SHARED, "modelzoo", "src")

VOCAB, HIDDEN, LAYERS, HEADS, FILTER, SEQ, BATCH = 100, 32, 2, 2, 64, 16, 4


def import_modelzoo(module):
    """A Model Zoo module, imported with Model Zoo's source on sys.path."""
    if MODELZOO_SRC not in sys.path:
        sys.path.insert(0, MODELZOO_SRC)
    if module in sys.modules:
        return sys.modules[module]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pydantic and deprecation chatter of Model Zoo
        return importlib.import_module(module)


_gpt2 = import_modelzoo("cerebras.modelzoo.models.nlp.gpt2.model")
_llama = import_modelzoo("cerebras.modelzoo.models.nlp.llama.model")
Gpt2Model, GPT2ModelConfig = _gpt2.Gpt2Model, _gpt2.GPT2ModelConfig
LlamaModel, LlamaModelConfig = _llama.LlamaModel, _llama.LlamaModelConfig

_COMMON = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_heads=HEADS,
               filter_size=FILTER, max_position_embeddings=SEQ,
               embd_pdrop=0.0, dropout_rate=0.0, attention_dropout_rate=0.0)


def gpt2_config(**overrides):
    """GPT-2 as Model Zoo's gpt2 configs define it (learned positions, LayerNorm, GELU,
    biases, tied embeddings), scaled down."""
    return GPT2ModelConfig(name="gpt2", **{**_COMMON, **overrides})


def llama_config(**overrides):
    """LLaMA as Model Zoo's llama configs define it (rotary positions, RMSNorm, SwiGLU,
    grouped-query attention, no biases, untied head), scaled down."""
    return LlamaModelConfig(
        name="llama", **{**_COMMON, **dict(
            position_embedding_type="rotary", rotary_dim=HIDDEN // HEADS, rope_theta=10000.0,
            share_embedding_weights=False, norm_type="rmsnorm", layer_norm_epsilon=1e-5,
            attention_type="scaled_dot_product", attention_module="multiquery_attention",
            extra_attention_params={"num_kv_groups": 1}, nonlinearity="swiglu",
            use_ffn_bias=False, use_projection_bias_in_attention=False,
            use_ffn_bias_in_attention=False, use_bias_in_output=False), **overrides})


MODELS = {"gpt2": (Gpt2Model, gpt2_config), "llama": (LlamaModel, llama_config)}


def build(name, seed=0, **overrides):
    """The model built from its config, then every parameter (norm scales and biases too,
    which Model Zoo initialises to ones and zeros) moved off its initial value at random."""
    cls, config = MODELS[name]
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = cls(config(**overrides))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def token_batches(steps, seed=1, padded=False):
    """`steps` batches as Model Zoo's GPT data processors yield them: int32 `input_ids`,
    `labels` (the inputs shifted by one) and `attention_mask` (the loss mask: all ones
    as GptHDF5MapDataProcessor makes it, or, `padded`, ones then zeros as its
    DummyDataProcessor does), each collated into a contiguous (BATCH, SEQ) tensor."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g, dtype=torch.int32)
        if padded:
            lengths = torch.randint(SEQ // 2, SEQ + 1, (BATCH,), generator=g)
            mask = (torch.arange(SEQ) < lengths[:, None]).to(torch.int32)
        else:
            mask = torch.ones(BATCH, SEQ, dtype=torch.int32)
        out.append({"input_ids": tokens[:, :-1].contiguous(),
                    "labels": tokens[:, 1:].contiguous(),
                    "attention_mask": mask})
    return out


def loader(batches):
    """A cstorch DataLoader over the in-memory batches (already collated)."""
    import cerebras.pytorch as cstorch
    return cstorch.utils.data.DataLoader(
        lambda: torch.utils.data.DataLoader(batches, batch_size=None))


def to_numpy(t):
    return np.asarray(t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else t,
                      dtype=np.float64)


def max_rel(actual, expected):
    """max |a - e| / max |e|: the difference relative to the tensor's scale."""
    a, e = to_numpy(actual), to_numpy(expected)
    return float(np.max(np.abs(a - e)) / max(np.max(np.abs(e)), 1e-30))


def assert_state_close(actual, expected, rtol):
    """Every entry of two state dicts equal within `rtol` relative to each tensor's scale
    (an element near zero carries the rounding of the tensor's larger ones, so elementwise
    relative error means nothing there). Returns the worst `max_rel` and its key."""
    assert sorted(actual) == sorted(expected)
    worst = (0.0, None)
    for key, e in expected.items():
        a, e = to_numpy(actual[key]), to_numpy(e)
        np.testing.assert_allclose(a, e, rtol=rtol, atol=rtol * np.max(np.abs(e)),
                                   err_msg=key)
        worst = max(worst, (max_rel(a, e), key))
    return worst
