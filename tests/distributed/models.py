"""The models and data the multi-process tests train, shared by the torchrun script and
the single-process references."""
import torch

STEPS = 5
GLOBAL_BATCH = 8
LR, MOMENTUM = 0.05, 0.9


def make_model(kind: str) -> torch.nn.Module:
    if kind == "mlp":
        return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(),
                                   torch.nn.Linear(16, 3))
    if kind == "bn":
        return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.BatchNorm1d(16),
                                   torch.nn.ReLU(), torch.nn.Linear(16, 3))
    raise ValueError(kind)


def global_batches(kind: str):
    g = torch.Generator().manual_seed(7)
    for _ in range(STEPS):
        x = torch.randn(GLOBAL_BATCH, 6, generator=g) * 2 + 0.5
        y = torch.randint(0, 3, (GLOBAL_BATCH,), generator=g)
        yield x, y
