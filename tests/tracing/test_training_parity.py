"""Traced training equals eager PyTorch: a small GPT and a CNN with BatchNorm."""
import copy

import torch
import torch.nn.functional as F

import cerebras.pytorch as cstorch
from examples.train_gpt import next_token_loss, update
from tests.models import SmallCNN, TinyGPT, rel_err

TOL = 1e-4


def _eager_sgd(model, lr, momentum):
    # The reference: torch's own SGD. cstorch's starts the momentum buffer at zero, which
    # equals torch's first-step buffer when dampening is 0.
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)


def test_gpt_matches_eager_pytorch():
    torch.manual_seed(0)
    model = TinyGPT()
    reference = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, 61, (4, 17), generator=gen) for _ in range(10)]

    cstorch.backend("CPU")
    compiled = cstorch.compile(model)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    @cstorch.trace
    def step(tokens):
        loss = next_token_loss(compiled, tokens)
        update(loss, model.parameters(), optimizer)
        return loss

    ref_opt = _eager_sgd(reference, 0.1, 0.9)
    for tokens in batches:
        loss = step(tokens)
        ref_loss = next_token_loss(reference, tokens)
        update(ref_loss, reference.parameters(), ref_opt)
        assert rel_err(loss, ref_loss.detach()) < TOL
    assert step.captures == 1
    ours, theirs = model.state_dict(), reference.state_dict()
    assert ours.keys() == theirs.keys()
    for name in theirs:
        assert rel_err(ours[name], theirs[name]) < TOL, name
    assert model.head.weight is model.tok.weight


def test_cnn_with_batchnorm_train_then_eval_matches_eager():
    torch.manual_seed(0)
    model = SmallCNN()
    reference = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(2)
    data = [(torch.randn(8, 3, 16, 16, generator=gen), torch.randint(0, 10, (8,), generator=gen))
            for _ in range(10)]

    cstorch.backend("CPU")
    compiled = cstorch.compile(model)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    @cstorch.trace
    def train_step(x, y):
        loss = F.cross_entropy(compiled(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    @cstorch.trace
    @torch.no_grad()
    def eval_step(x):
        return compiled(x)

    ref_opt = _eager_sgd(reference, 0.05, 0.9)
    model.train()
    reference.train()
    for x, y in data:
        loss = train_step(x, y)
        ref_loss = F.cross_entropy(reference(x), y)
        ref_opt.zero_grad()
        ref_loss.backward()
        ref_opt.step()
        assert rel_err(loss, ref_loss.detach()) < TOL

    model.eval()
    reference.eval()
    x = data[0][0]
    with torch.no_grad():
        expected = reference(x)
    assert rel_err(eval_step(x), expected) < TOL
    ours, theirs = model.state_dict(), reference.state_dict()
    for name in theirs:  # running_mean, running_var and num_batches_tracked included
        assert rel_err(ours[name], theirs[name]) < TOL, name
    assert int(ours["features.1.num_batches_tracked"]) == 10


def test_batchnorm_with_a_cumulative_average_trains_as_eager():
    """`momentum=None` averages the running statistics over every batch so far, with the
    factor 1 / num_batches_tracked that eager PyTorch computes on the host."""
    torch.manual_seed(3)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4, momentum=None), torch.nn.ReLU(),
        torch.nn.Flatten(), torch.nn.Linear(64, 6), torch.nn.BatchNorm1d(6, momentum=None))
    reference = copy.deepcopy(model)
    cstorch.backend("CPU")
    compiled = cstorch.compile(model)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)

    @cstorch.trace
    def step(x, y):
        loss = F.mse_loss(compiled(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    gen = torch.Generator().manual_seed(4)
    for _ in range(5):
        x, y = torch.randn(8, 3, 6, 6, generator=gen), torch.randn(8, 6, generator=gen)
        loss = step(x, y)
        ref_loss = F.mse_loss(reference(x), y)
        ref_opt.zero_grad()
        ref_loss.backward()
        ref_opt.step()
        assert rel_err(loss, ref_loss) < TOL
    assert step.captures == 1
    for (name, ours), theirs in zip(model.state_dict().items(), reference.state_dict().values()):
        if name.endswith("num_batches_tracked"):
            assert int(ours) == int(theirs) == 5
        else:
            assert rel_err(ours, theirs) < TOL, name
    model.eval(), reference.eval()
    x = torch.randn(4, 3, 6, 6, generator=gen)
    with torch.no_grad():
        assert rel_err(compiled(x), reference(x)) < TOL
