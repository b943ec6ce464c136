"""Small models the tests train."""
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import cerebras.pytorch as cstorch

from examples.train_gpt import TinyGPT  # noqa: F401  (the example's model)


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


def sgd_pair(eager, ours):
    """A traced SGD-momentum step that trains `ours` (compiled here) by mean squared error,
    and the same step in eager PyTorch for `eager`: (step, eager_step, optimizer,
    reference optimizer). Both steps return the loss."""
    compiled = cstorch.compile(ours)
    optimizer = cstorch.optim.SGD(ours.parameters(), lr=0.1, momentum=0.9)
    reference = torch.optim.SGD(eager.parameters(), lr=0.1, momentum=0.9)

    @cstorch.trace
    def step(x, y):
        loss = F.mse_loss(compiled(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    def eager_step(x, y):
        loss = F.mse_loss(eager(x), y)
        reference.zero_grad()
        loss.backward()
        reference.step()
        return float(loss)

    return step, eager_step, optimizer, reference


def classifier_step(compiled, optimizer):
    """A traced training step of a classifier: cross-entropy, zero_grad, backward, step."""
    @cstorch.trace
    def step(x, y):
        loss = F.cross_entropy(compiled(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss
    return step
