"""The effect of the CSX precision optimization level on a small model's training loss.

Trains the tests' TinyGPT (AdamW, lr 3e-3, batch 8 x 17 tokens, 30 steps) from one
initialisation at POL 0, 1 and 2 on the CSX backend, and in eager PyTorch, and prints the
losses at a few steps and each level's largest relative difference from eager over all
steps. Run: python -m benchmarks.precision_levels
"""
import copy
import importlib
import sys

import torch

import cerebras.pytorch as cstorch
from examples.train_gpt import next_token_loss
from tests.models import TinyGPT

# Several runs in one process, each on a backend of its own: each new backend replaces
# the last, as in the test suite (a user's second backend is refused).
importlib.import_module("cstorch.backend")._replacing_allowed = True

STEPS = 30


def batches():
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, 61, (8, 17), generator=g) for _ in range(STEPS)]


def run_eager(model, data):
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for tokens in data:
        loss = next_token_loss(model, tokens)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def run_csx(model, data, level):
    cstorch.backends.csx.precision.optimization_level = level
    cstorch.backend("CSX")
    compiled = cstorch.compile(model)
    opt = cstorch.optim.AdamW(model.parameters(), lr=3e-3)

    @cstorch.trace
    def step(tokens):
        loss = next_token_loss(compiled, tokens)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    return [float(step(t)) for t in data]


def main():
    torch.manual_seed(0)
    base = TinyGPT()
    data = batches()
    eager = run_eager(copy.deepcopy(base), data)
    rows = [("eager float32", eager)]
    for level in (0, 1, 2):
        rows.append((f"CSX POL {level}", run_csx(copy.deepcopy(base), data, level)))
    cstorch.backends.csx.precision.reset()
    shown = (0, 9, 19, STEPS - 1)
    pol0 = rows[1][1]
    print("| run | " + " | ".join(f"loss step {i + 1}" for i in shown)
          + " | max rel diff from eager | max rel diff from POL 0 |")
    print("|---" * (len(shown) + 3) + "|")
    for name, losses in rows:
        diff = max(abs(a - b) / abs(b) for a, b in zip(losses, eager))
        diff0 = max(abs(a - b) / abs(b) for a, b in zip(losses, pol0))
        print(f"| {name} | " + " | ".join(f"{losses[i]:.6f}" for i in shown)
              + f" | {diff:.2e} | {diff0:.2e} |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
