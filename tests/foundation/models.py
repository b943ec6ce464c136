"""Small models the foundation tests train, and an eager PyTorch reference loop."""
import math

import numpy as np

import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, dim, heads, block):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.drop = nn.Dropout(0.0)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        mask = torch.tril(torch.ones(t, t))  # created inside forward, on purpose
        att = att.masked_fill(mask == 0, float("-inf"))
        att = self.drop(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, d)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, dim, heads, block):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads, block)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab=61, dim=32, heads=4, layers=2, block=16):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(1, block, dim) * 0.02)
        self.blocks = nn.Sequential(*[Block(dim, heads, block) for _ in range(layers)])
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos[:, :t]
        return self.head(self.ln(self.blocks(x)))


class SmallCNN(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.SiLU(), nn.AvgPool2d(2))
        self.head = nn.Linear(16 * 4 * 4, classes)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


def rel_err(a, b):
    a, b = (v.detach().double() if isinstance(v, torch.Tensor)
            else torch.from_numpy(np.array(v, dtype=np.float64)) for v in (a, b))
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))
