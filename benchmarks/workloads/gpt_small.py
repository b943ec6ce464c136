"""gpt-small: the 4-layer GPT of examples/train_gpt.py (vocabulary 1000, d_model 256, 4 heads,
sequence 128, batch 8, AdamW), the model benchmarks/first_step.py compiles."""
import jax
import torch

from benchmarks.workloads import _jax
from examples.train_gpt import TinyGPT, next_token_loss

VOCAB, DIM, HEADS, LAYERS, SEQ, BATCH = 1000, 256, 4, 4, 128, 8
TITLE = (f"GPT {LAYERS} layers, d_model {DIM}, {HEADS} heads, sequence {SEQ}, batch {BATCH}, "
         f"vocabulary {VOCAB}, AdamW")
SIZES = {"full": (20, 7), "quick": (2, 2)}
OPTIMIZER = ("AdamW", {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01})


def make_model():
    torch.manual_seed(0)
    return TinyGPT(vocab=VOCAB, dim=DIM, heads=HEADS, layers=LAYERS, block=SEQ)


def batches(n):
    g = torch.Generator().manual_seed(1)
    return [(torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g),) for _ in range(n)]


def loss(model, tokens):
    return next_token_loss(model, tokens)


jax_init = _jax.params_of


def logits(p, idx):
    """TinyGPT's forward: embedding and learned positions, pre-LayerNorm blocks of causal
    attention and an exact-GELU MLP, a final LayerNorm and the head tied to the embedding."""
    x = p["tok.weight"][idx] + p["pos"][:, :idx.shape[1]]
    for i in range(LAYERS):
        b = f"blocks.{i}"
        qkv = _jax.linear(p, f"{b}.attn.qkv", _jax.layer_norm(p, f"{b}.ln1", x))
        q, k, v = jax.numpy.split(qkv, 3, axis=-1)
        x = x + _jax.linear(p, f"{b}.attn.proj", _jax.causal_attention(q, k, v, HEADS))
        h = _jax.linear(p, f"{b}.mlp.0", _jax.layer_norm(p, f"{b}.ln2", x))
        x = x + _jax.linear(p, f"{b}.mlp.2", jax.nn.gelu(h, approximate=False))
    return _jax.layer_norm(p, "ln", x) @ p["tok.weight"].T


def jax_loss(params, buffers, tokens):
    return _jax.next_token_loss(lambda idx: logits(params, idx), tokens), buffers
