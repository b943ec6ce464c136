"""transformer-lm: a causal language model on `nn.TransformerEncoder` with pre-LayerNorm
layers (norm_first=True): 4 layers, d_model 256, 4 heads, feed-forward 1024 (ReLU), no
dropout, a final LayerNorm and an untied head: 3,705,320 parameters (about 3.7M).
Vocabulary 1000, sequence 128, batch 8, AdamW."""
import jax
import torch
import torch.nn as nn
import torch.nn.functional as F

from benchmarks.workloads import _jax

VOCAB, DIM, HEADS, LAYERS, FF, SEQ, BATCH = 1000, 256, 4, 4, 1024, 128, 8
SIZES = {"full": (20, 7), "quick": (2, 2)}
OPTIMIZER = ("AdamW", {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01})


class TransformerLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Parameter(torch.randn(1, SEQ, DIM) * 0.02)
        layer = nn.TransformerEncoderLayer(DIM, HEADS, FF, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, LAYERS, norm=nn.LayerNorm(DIM),
                                             enable_nested_tensor=False)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, idx):
        t = idx.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(t)
        x = self.tok(idx) + self.pos[:, :t]
        return self.head(self.encoder(x, mask=mask, is_causal=True))


def make_model():
    torch.manual_seed(0)
    return TransformerLM()


PARAMS = 3_705_320
TITLE = (f"nn.TransformerEncoder LM, norm_first, {LAYERS} layers, d_model {DIM}, {HEADS} heads, "
         f"FF {FF}, {PARAMS / 1e6:.2f}M params, sequence {SEQ}, batch {BATCH}, AdamW")


def batches(n):
    g = torch.Generator().manual_seed(1)
    return [(torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g),) for _ in range(n)]


def loss(model, tokens):
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


jax_init = _jax.params_of


def logits(p, idx):
    """The encoder layer's pre-LN path: x + attention(norm1(x)), then x + FF(norm2(x))."""
    x = p["tok.weight"][idx] + p["pos"][:, :idx.shape[1]]
    for i in range(LAYERS):
        b = f"encoder.layers.{i}"
        h = _jax.layer_norm(p, f"{b}.norm1", x)
        qkv = h @ p[f"{b}.self_attn.in_proj_weight"].T + p[f"{b}.self_attn.in_proj_bias"]
        q, k, v = jax.numpy.split(qkv, 3, axis=-1)
        x = x + _jax.linear(p, f"{b}.self_attn.out_proj", _jax.causal_attention(q, k, v, HEADS))
        h = _jax.linear(p, f"{b}.linear1", _jax.layer_norm(p, f"{b}.norm2", x))
        x = x + _jax.linear(p, f"{b}.linear2", jax.nn.relu(h))
    return _jax.linear(p, "head", _jax.layer_norm(p, "encoder.norm", x))


def jax_loss(params, buffers, tokens):
    return _jax.next_token_loss(lambda idx: logits(params, idx), tokens), buffers
