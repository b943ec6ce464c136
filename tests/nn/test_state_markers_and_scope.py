"""`cerebras.pytorch.nn.Parameter`, `Buffer` and `Scope`: module state marked as PyTorch
marks it, and a named region that leaves values unchanged, eagerly and traced."""
import copy

import torch

import cerebras.pytorch as cstorch
from tests.models import rel_err


class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = cstorch.nn.Parameter(torch.randn(4, 3))
        self.scale = cstorch.nn.Buffer(torch.tensor(2.0))
        self.offset = cstorch.nn.Buffer(torch.ones(3), persistent=False)
        self.scope = cstorch.nn.Scope("scaled")

    def forward(self, x):
        x = self.scope(x)
        return self.scope.exit(x @ self.weight * self.scale + self.offset)


def test_parameter_and_buffer_register_as_torchs_do():
    model = Scaled()
    assert isinstance(model.weight, torch.nn.Parameter)
    assert isinstance(model.weight, cstorch.nn.Parameter) and model.weight.requires_grad
    assert not cstorch.nn.Parameter(torch.ones(2), requires_grad=False).requires_grad
    assert [n for n, _ in model.named_parameters()] == ["weight"]
    assert [n for n, _ in model.named_buffers()] == ["scale", "offset"]
    assert list(model.state_dict()) == ["weight", "scale"]  # offset is not persistent
    assert isinstance(cstorch.nn.Buffer(torch.ones(1)), cstorch.nn.Buffer)
    assert not isinstance(torch.ones(1), cstorch.nn.Buffer)


def test_scope_passes_values_through():
    scope = cstorch.nn.Scope("block")
    x = torch.randn(3)
    assert scope(x) is x and scope.exit(x) is x
    assert scope.scope_name == "block"


def test_a_model_with_them_trains_in_a_traced_step_as_eager():
    torch.manual_seed(0)
    model = Scaled()
    reference = copy.deepcopy(model)
    cstorch.backend("CPU")
    compiled = cstorch.compile(model)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)

    @cstorch.trace
    def step(x):
        loss = compiled(x).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        x = torch.randn(5, 4, generator=gen)
        loss = step(x)
        ref_loss = reference(x).square().mean()
        ref_opt.zero_grad()
        ref_loss.backward()
        ref_opt.step()
        assert rel_err(loss, ref_loss.detach()) < 1e-4
    assert rel_err(model.weight, reference.weight) < 1e-4
