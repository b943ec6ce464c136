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


def shard(t: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """Process `rank`'s part of a global batch, split along the first dimension."""
    part = t.shape[0] // world
    return t[rank * part:(rank + 1) * part]


def train_cstorch(model, backend, kind: str, rank: int = 0, world: int = 1):
    """STEPS SGD-momentum steps of `model` traced on `backend`, process `rank` of `world`
    passing its shard of each global batch; the losses."""
    import cerebras.pytorch as cstorch
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    loss_fn = torch.nn.CrossEntropyLoss()

    @cstorch.trace
    def step(x, y):
        loss = loss_fn(compiled(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    return [float(step(shard(x, rank, world), shard(y, rank, world)))
            for x, y in global_batches(kind)]
