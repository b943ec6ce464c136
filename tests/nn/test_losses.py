"""behaviour.json's `nn_losses` scenario (every `cerebras.pytorch.nn` loss of the real
package: its attributes, whether it is a thin wrapper of torch's loss or a Module of its
own, `use_autogen`, and its values on fixed inputs with each reduction), reproduced
eagerly and inside traced steps, where it must equal eager PyTorch; and training through
the losses this project implements itself."""
import copy
import json
import os

import pytest
import torch

import cerebras.pytorch as cstorch
from tests.conftest import SHARED
from tests.models import rel_err

with open(os.path.join(SHARED, "fixtures", "behaviour.json")) as f:
    SCENARIO = json.load(f)["scenarios"]["nn_losses"]
CASES = SCENARIO["cases"]
TOL = 1e-4


def tensor(spec):
    dtype = getattr(torch, spec["dtype"].split(".")[1])
    return torch.tensor(spec["values"], dtype=dtype).reshape(spec["shape"])


def inputs(case):
    return [tensor(x) if isinstance(x, dict) else x for x in case["inputs"]]


def build(name, **extra):
    return getattr(cstorch.nn, name)(**CASES[name]["ctor_kwargs"], **extra)


def recorded(value):
    """An attribute as the scenario recorded it."""
    if isinstance(value, torch.Tensor):
        return {"tensor": True, "dtype": str(value.dtype), "shape": list(value.shape),
                "values": value.reshape(-1).tolist()}
    if callable(value) and not isinstance(value, type):
        return f"callable:{type(value).__name__}"
    return value


def first_torch_class(cls):
    for klass in cls.__mro__:
        if klass.__module__.startswith("torch."):
            return f"{klass.__module__}.{klass.__qualname__}"
    return None


def assert_close(got, spec, rel=1e-5):
    want = tensor(spec)
    assert isinstance(got, torch.Tensor) and got.dtype == want.dtype
    assert tuple(got.shape) == tuple(want.shape)
    assert torch.allclose(got, want, rtol=rel, atol=1e-6), (got, want)


def test_every_loss_of_the_scenario_is_here():
    losses = sorted(n for n in cstorch.nn.__all__ if n.endswith("Loss"))
    assert losses == sorted(SCENARIO["classes"])


@pytest.mark.parametrize("name", list(CASES))
def test_attributes_and_kind(name):
    case = CASES[name]
    loss = build(name)
    # The scenario recorded vars() without Module's own `training` flag.
    attrs = {k: recorded(v) for k, v in vars(loss).items()
             if not k.startswith("_") and k != "training"}
    assert list(attrs) == list(case["attrs"])
    assert attrs == case["attrs"]
    assert first_torch_class(type(loss)) == case["first_torch_class_in_mro"]


@pytest.mark.parametrize("name", list(CASES))
def test_use_autogen(name):
    facts = CASES[name]["use_autogen_accepted"]
    if "error" in facts:
        with pytest.raises(TypeError) as info:
            build(name, use_autogen=True)
        assert str(info.value) == facts["message"]
        return
    with pytest.warns(UserWarning, match="use_autogen=True"):
        loss = build(name, use_autogen=True)
    assert loss.autogen_enabled is True
    assert build(name, use_autogen=False).autogen_enabled is False


@pytest.mark.parametrize("name", list(CASES))
def test_values_on_the_fixture_inputs(name):
    case = CASES[name]
    assert_close(build(name)(*inputs(case)), case["value"]["value"])
    for reduction in ("sum", "none"):
        key = f"value_reduction_{reduction}"
        if key not in case:
            continue
        if "error" in case[key]:
            error = {"AssertionError": AssertionError, "ValueError": ValueError}
            with pytest.raises(error[case[key]["error"]]) as info:
                getattr(cstorch.nn, name)(**case["ctor_kwargs"], reduction=reduction)(
                    *inputs(case))
            assert str(info.value) == case[key]["message"]
            continue
        loss = getattr(cstorch.nn, name)(**case["ctor_kwargs"], reduction=reduction)
        assert_close(loss(*inputs(case)), case[key]["value"])


@pytest.mark.parametrize("name", list(CASES))
def test_inside_a_traced_step_equals_eager(name):
    case = CASES[name]
    cstorch.backend("CPU")
    loss = build(name)
    args = inputs(case)
    tensors = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]

    @cstorch.trace
    def step(*values):
        call = list(args)
        for i, v in zip(tensors, values):
            call[i] = v
        return loss(*call)

    traced = step(*[args[i] for i in tensors])
    eager = build(name)(*args)
    assert rel_err(traced, eager) < TOL


# The losses implemented here, each with the torch loss it must equal, a way to make its
# target from the batch, and the extra inputs it takes.
OWN = {
    "HuberLoss": (torch.nn.HuberLoss(delta=0.5), lambda y: y, {"delta": 0.5}),
    "SmoothL1Loss": (torch.nn.SmoothL1Loss(beta=0.3), lambda y: y, {"beta": 0.3}),
    "GaussianNLLLoss": (torch.nn.GaussianNLLLoss(full=True), lambda y: y, {"full": True}),
    "MultiMarginLoss": (torch.nn.MultiMarginLoss(p=2, margin=0.7,
                                                 weight=torch.tensor([1., 2., .5, 1.5])),
                        lambda y: y.argmax(-1), {"p": 2, "margin": 0.7,
                                                 "weight": torch.tensor([1., 2., .5, 1.5])}),
}


def _loss_value(name, loss, out, y):
    if name == "GaussianNLLLoss":
        return loss(out, y, torch.nn.functional.softplus(out) + 0.1)
    return loss(out, OWN[name][1](y))


@pytest.mark.parametrize("name", list(OWN))
def test_training_through_own_losses_equals_eager_torch(name):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4))
    reference = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(1)
    data = [(torch.randn(6, 5, generator=gen), torch.randn(6, 4, generator=gen))
            for _ in range(4)]
    torch_loss, _, kwargs = OWN[name]

    cstorch.backend("CPU")
    compiled = cstorch.compile(model)
    loss_fn = getattr(cstorch.nn, name)(**kwargs)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)

    @cstorch.trace
    def train_step(x, y):
        loss = _loss_value(name, loss_fn, compiled(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for x, y in data:
        loss = train_step(x, y)
        ref_loss = _loss_value(name, torch_loss, reference(x), y)
        ref_opt.zero_grad()
        ref_loss.backward()
        ref_opt.step()
        assert rel_err(loss, ref_loss.detach()) < TOL
    for (key, ours), theirs in zip(model.state_dict().items(), reference.state_dict().values()):
        assert rel_err(ours, theirs) < TOL, key


def test_dice_losses_train_inside_a_traced_step_as_eager():
    torch.manual_seed(0)
    model = torch.nn.Conv3d(2, 3, kernel_size=1)
    reference = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(2)
    shape = [2, 3, 2, 3, 2]
    data = [(torch.randn(2, 2, 2, 3, 2, generator=gen),
             torch.randint(0, 3, (2, 2, 3, 2), generator=gen)) for _ in range(3)]

    cstorch.backend("CPU")
    compiled = cstorch.compile(model)
    loss_fn = cstorch.nn.DiceCELoss(num_classes=3, include_background=False, wc=0.3, wd=0.7)
    dice = cstorch.nn.DiceLoss(num_classes=3, include_background=True)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.5)

    @cstorch.trace
    def train_step(x, y):
        out = compiled(x)
        loss = loss_fn(out, y, shape) + (1 - dice(out, y, shape)).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    def independent(out, y):
        """The same losses in plain torch: softmax, one-hot labels, Dice per class."""
        p = torch.softmax(out, 1)
        t = torch.nn.functional.one_hot(y, 3).permute(0, 4, 1, 2, 3).float()
        d = 2 * (p * t).sum((2, 3, 4)) / (p.sum((2, 3, 4)) + t.sum((2, 3, 4)) + 1e-6)
        ce = torch.nn.functional.cross_entropy(out, y)
        return 0.3 * ce + 0.7 * (1 - d[:, 1:].mean()) + (1 - d).mean()

    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.5)
    for x, y in data:
        loss = train_step(x, y)
        ref_loss = independent(reference(x), y)
        ref_opt.zero_grad()
        ref_loss.backward()
        ref_opt.step()
        assert rel_err(loss, ref_loss.detach()) < TOL
    assert rel_err(model.weight, reference.weight) < TOL


def test_own_losses_refuse_what_they_cannot_compute():
    nn = cstorch.nn
    with pytest.raises(ValueError, match="only p == 1 and p == 2"):
        nn.MultiMarginLoss(p=3)
    with pytest.raises(ValueError, match="not a valid value for reduction"):
        nn.HuberLoss(reduction="avg")
    with pytest.raises(TypeError, match="GaussianNLLLoss.__init__"):
        nn.GaussianNLLLoss(True)  # keyword-only, as in torch
    with pytest.raises(ValueError, match="var has negative entries"):
        nn.GaussianNLLLoss()(torch.zeros(3), torch.zeros(3), -torch.ones(3))
    with pytest.raises(ValueError, match="does not fit input"):
        nn.GaussianNLLLoss()(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 2))
    with pytest.raises(ValueError, match="do not match input_shape"):
        nn.DiceLoss(num_classes=3)(torch.zeros(1, 3, 2), torch.zeros(1, 2), [1, 4, 2])
    with pytest.raises(ValueError, match="needs to_onehot_x=True"):
        nn.DiceLoss(num_classes=3, use_softmax=False, use_argmax=True)
    with pytest.raises(ValueError, match="beta must be non-negative"):
        nn.SmoothL1Loss(beta=-1.0)


def test_own_losses_take_torchs_arguments_positionally():
    x, y = torch.randn(4, 5), torch.randn(4, 5)
    for ours, theirs in [(cstorch.nn.SmoothL1Loss(None, None, "sum", 0.5),
                          torch.nn.SmoothL1Loss(None, None, "sum", 0.5)),
                         (cstorch.nn.HuberLoss("none", 0.25), torch.nn.HuberLoss("none", 0.25)),
                         (cstorch.nn.SmoothL1Loss(size_average=False),
                          torch.nn.SmoothL1Loss(size_average=False))]:
        assert torch.allclose(ours(x, y), theirs(x, y), rtol=1e-6)
    labels = torch.tensor([0, 3, 1, 4])
    assert torch.allclose(cstorch.nn.MultiMarginLoss(1, 2.0)(x, labels),
                          torch.nn.MultiMarginLoss(1, 2.0)(x, labels), rtol=1e-6)
    assert torch.allclose(cstorch.nn.MultiMarginLoss()(x[0], labels[0]),
                          torch.nn.MultiMarginLoss()(x[0], labels[0]), rtol=1e-6)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_ctc_loss_in_a_traced_step_equals_torchs_with_its_gradient(reduction):
    """PyTorch's CTC kernel cannot be compiled (its work depends on the lengths' values);
    traced, CTCLoss computes the same loss and gradient with static shapes: targets padded
    and concatenated, lengths that differ, a repeated label."""
    cstorch.backend("CPU")
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(7, 3, 5, generator=gen)
    padded = torch.tensor([[1, 1, 3], [2, 4, 0], [3, 2, 0]])
    concatenated = torch.tensor([1, 1, 3, 2, 4, 3, 2])
    input_lengths, target_lengths = torch.tensor([7, 5, 4]), torch.tensor([3, 2, 2])
    loss = cstorch.nn.CTCLoss(reduction=reduction, zero_infinity=True)

    @cstorch.trace
    def step(x, targets):
        x = x.clone().requires_grad_()
        value = loss(x.log_softmax(-1), targets, input_lengths, target_lengths)
        (grad,) = torch.autograd.grad(value.sum(), x)
        return value, grad

    for targets in (padded, concatenated):
        value, grad = step(logits, targets)
        x = logits.clone().requires_grad_()
        want = torch.nn.functional.ctc_loss(x.log_softmax(-1), targets, input_lengths,
                                            target_lengths, reduction=reduction,
                                            zero_infinity=True)
        (want_grad,) = torch.autograd.grad(want.sum(), x)
        assert rel_err(value, want.detach()) < TOL
        assert rel_err(grad, want_grad) < TOL
