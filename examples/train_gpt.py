"""Train a small GPT with cstorch: the script you would write for a Cerebras system.

    python examples/train_gpt.py [--steps 40] [--backend CPU]

Token embedding, learned positions, causal self-attention, LayerNorm, GELU MLP and a
head tied to the embedding, trained with SGD (momentum) and gradient clipping on a
synthetic next-token task. The first step is captured and compiled by XLA; the rest run
the compiled program. Prints the loss as it goes and writes a checkpoint at the end.
"""
import argparse
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

import cerebras.pytorch as cstorch


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
        nn.init.normal_(self.tok.weight, std=0.02)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos[:, :t]
        return self.head(self.ln(self.blocks(x)))


def next_token_loss(model, tokens):
    """Cross-entropy of predicting each token from those before it."""
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def update(loss, parameters, optimizer, max_norm=1.0):
    """One optimizer step on `loss`, gradients clipped to `max_norm`."""
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(list(parameters), max_norm)
    optimizer.step()


def synthetic_tokens(num_samples, length, vocab, seed=0):
    """Sequences that count upwards mod `vocab` from a random start: learnable, but not
    before a few dozen steps."""
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, vocab, (num_samples, 1), generator=g)
    return (start + torch.arange(length + 1)) % vocab


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--backend", default="CPU", choices=["CPU", "CSX", "GPU"])
    parser.add_argument("--out", default=os.environ.get("OUT_DIR", "out"))
    args = parser.parse_args()

    torch.manual_seed(0)
    backend = cstorch.backend(args.backend, artifact_dir=os.path.join(args.out, "cerebras_logs"))
    model = TinyGPT()
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.3, momentum=0.9)

    def input_fn(batch_size):
        data = torch.utils.data.TensorDataset(synthetic_tokens(512, 16, 61))
        return torch.utils.data.DataLoader(data, batch_size=batch_size, shuffle=True, drop_last=True)

    @cstorch.trace
    def training_step(batch):
        (tokens,) = batch
        loss = next_token_loss(compiled, tokens)
        update(loss, model.parameters(), optimizer)
        return loss

    @cstorch.step_closure
    def report(loss, step):
        if step == 1 or step % 5 == 0:
            print(f"step {step:4d}  loss {loss.item():.4f}", flush=True)

    @cstorch.checkpoint_closure
    def save(step):
        path = os.path.join(args.out, f"gpt_{step}.mdl")
        cstorch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, path)
        print(f"saved {path}", flush=True)

    executor = cstorch.utils.data.DataExecutor(
        cstorch.utils.data.DataLoader(input_fn, 32), num_steps=args.steps, checkpoint_steps=args.steps)
    for step, batch in enumerate(executor, start=1):
        loss = training_step(batch)
        report(loss, step)
        save(step)
    print(f"done: {training_step.captures} capture(s), final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
