"""mlp-tiny: the 3-layer width-64 MLP of benchmarks/mlp_step.py (batch 32, SGD momentum 0.9,
cross-entropy): framework overhead per step, not compute, decides its speed."""
import torch
import torch.nn.functional as F

from benchmarks import mlp_step

TITLE = (f"MLP 3 layers of width {mlp_step.WIDTH}, batch {mlp_step.BATCH}, "
         f"SGD momentum {mlp_step.MOMENTUM}")
SIZES = {"full": (300, 15), "quick": (20, 3)}
OPTIMIZER = ("SGD", {"lr": mlp_step.LR, "momentum": mlp_step.MOMENTUM})
make_model = mlp_step.make_model


def batches(n):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(mlp_step.BATCH, mlp_step.WIDTH, generator=g),
             torch.randint(0, mlp_step.CLASSES, (mlp_step.BATCH,), generator=g)) for _ in range(n)]


def loss(model, x, y):
    return F.cross_entropy(model(x), y)


def jax_init(model):
    return [p.detach().numpy().copy() for p in model.parameters()], {}


def jax_loss(params, buffers, x, y):
    return mlp_step.jax_loss(params, x, y), buffers
