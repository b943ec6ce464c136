"""Model Zoo's GPT-2 and LLaMA, tiny, trained 5 steps under `@cstorch.trace` with a
`DataExecutor` on the CPU backend, each step's loss the model's own (GPTLMHeadModelLoss,
num_tokens scaling): the losses and every parameter equal the same model trained eagerly."""
import copy

import numpy as np
import pytest
import torch

import cerebras.pytorch as cstorch
from tests.modelzoo.common import assert_state_close, build, loader, max_rel, token_batches

STEPS = 5
RTOL = 1e-5


def train_traced(model, make_optimizer, batches):
    """The Model Zoo training loop: compile, optimizer on the compiled module's parameters,
    one traced step (forward, zero_grad, backward, step) driven by a DataExecutor."""
    compiled = cstorch.compile(model, cstorch.backend())
    optimizer = make_optimizer(model.parameters())

    @cstorch.trace
    def training_step(batch):
        loss = compiled(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    executor = cstorch.utils.data.DataExecutor(loader(batches), num_steps=STEPS)
    losses = [training_step(batch) for batch in executor]
    assert training_step.captures == 1
    return [float(loss) for loss in losses]


def train_eager(model, optimizer, batches):
    losses = []
    for batch in batches:
        loss = model(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def check(model, reference, initial, losses, ref_losses):
    # The runs moved every parameter well past the tolerance, so equality is not vacuous;
    # all but the key projection's bias, whose gradient is zero (softmax over the keys
    # ignores what is added to every key's score alike).
    ref_state = reference.state_dict()
    still = [k for k, v in initial.items() if max_rel(ref_state[k], v) < 100 * RTOL]
    assert all(k.endswith("proj_k_dense_layer.bias") for k in still), still
    np.testing.assert_allclose(losses, ref_losses, rtol=RTOL)
    assert len(losses) == STEPS
    # state_dict holds every parameter under each of its names: GPT-2's tied lm_head too
    worst_param = assert_state_close(model.state_dict(), reference.state_dict(), RTOL)
    print(f"max rel diff: losses {max_rel(losses, ref_losses):.2e}, "
          f"parameters {worst_param[0]:.2e} ({worst_param[1]})")


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_sgd_training_equals_eager_torch(name):
    model = build(name)
    reference = copy.deepcopy(model)
    initial = copy.deepcopy(model.state_dict())
    model.train()
    reference.train()
    batches = token_batches(STEPS)

    ref_losses = train_eager(reference, torch.optim.SGD(reference.parameters(), lr=0.5),
                             batches)
    cstorch.backend("CPU")
    losses = train_traced(model, lambda params: cstorch.optim.SGD(params, lr=0.5), batches)

    check(model, reference, initial, losses, ref_losses)


ADAMW = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-5, weight_decay=0.1, correct_bias=True)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_adamw_training_equals_cstorch_eager(name):
    """The reference is the same cstorch.optim.AdamW stepping eagerly on the host
    parameters of an uncompiled copy (hyperparameters of Model Zoo's LLaMA configs)."""
    model = build(name)
    reference = copy.deepcopy(model)
    initial = copy.deepcopy(model.state_dict())
    model.train()
    reference.train()
    batches = token_batches(STEPS)

    cstorch.backend("CPU")
    ref_losses = train_eager(reference, cstorch.optim.AdamW(reference.parameters(), **ADAMW),
                             batches)
    losses = train_traced(model, lambda params: cstorch.optim.AdamW(params, **ADAMW), batches)

    check(model, reference, initial, losses, ref_losses)
