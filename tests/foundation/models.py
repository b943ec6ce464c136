"""Small models the foundation tests train."""
import numpy as np
import torch
import torch.nn as nn

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
