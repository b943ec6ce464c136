"""Activation rematerialisation in the loop over identical layers
(`cstorch.backends.csx.performance.scan_blocks_remat`): the gradient loop computes each
layer's forward ops again instead of reading them stacked, with the same results."""
import contextlib
import copy
import logging
import re

import pytest
import torch

import cerebras.pytorch as cstorch
from tests.bridge.test_scan_blocks import VOCAB, Block, Model, _batches, _dots, _loss, _train
from tests.models import rel_err

performance = cstorch.backends.csx.performance


@contextlib.contextmanager
def remat(value):
    before = performance.scan_blocks_remat
    performance.scan_blocks_remat = value
    try:
        yield
    finally:
        performance.scan_blocks_remat = before


@pytest.mark.slow
def test_rematerialised_loop_equals_the_stored_one_with_dropout(caplog):
    torch.manual_seed(0)
    model = Model(p=0.2, layers=2)
    other = copy.deepcopy(model)
    batches = _batches(2)
    with remat(True), caplog.at_level(logging.INFO, logger="bridge.scan"):
        losses, state, program, _ = _train(model, True, batches)
    # Every activation the forward loop stacked was read only by the gradient loop.
    assert re.search(r"model\.blocks\[0:2\] compute their forward ops again: (\d+) of \1 "
                     r"stacked forward values no longer kept", caplog.text), caplog.text
    with remat(False):
        ref_losses, ref_state, ref_program, _ = _train(other, True, batches)
    # Forward (the losses) and gradients (the parameters SGD moved with them) alike: the
    # recomputed forward ops draw the same dropout masks, each layer its own.
    assert rel_err(losses, ref_losses) < 1e-6
    for name in ref_state:
        assert rel_err(state[name], ref_state[name]) < 1e-6, name
    # The gradient loop's body holds the forward body's products again.
    assert _dots(program) > _dots(ref_program)


def _temp_bytes(remat_on: bool, layers=4, dim=32, tokens=32):
    """XLA's scratch memory for one SGD step of a deep and wide enough stack of blocks."""
    torch.manual_seed(0)
    model = Model(blocks=[Block(dim=dim, hidden=4 * dim) for _ in range(layers)])
    model.tok, model.ln = torch.nn.Embedding(VOCAB, dim), torch.nn.LayerNorm(dim)
    model.head = torch.nn.Linear(dim, VOCAB)
    with remat(remat_on):
        performance.scan_blocks = True
        try:
            cstorch.backend("CPU")
            compiled = cstorch.compile(model)
            optimizer = cstorch.optim.SGD(model.parameters(), lr=0.01)

            @cstorch.trace
            def step(batch):
                loss = _loss(compiled, batch)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                return loss

            batch = torch.randint(0, VOCAB, (8, tokens + 1),
                                  generator=torch.Generator().manual_seed(1))
            loss = float(step(batch))
        finally:
            performance.scan_blocks = False
    program = next(iter(step.programs.values()))[0]
    return program.compiled.executable.memory_analysis().temp_size_in_bytes, loss


@pytest.mark.slow
def test_rematerialisation_needs_less_scratch_memory():
    stored, loss = _temp_bytes(False)
    recomputed, remat_loss = _temp_bytes(True)
    assert remat_loss == pytest.approx(loss, rel=1e-6)
    # The forward loop no longer stacks every layer's activations for the gradients.
    assert recomputed < 0.7 * stored, (recomputed, stored)


def test_the_flag_warns_without_scan_blocks_and_is_part_of_the_program_key():
    cstorch.backend("CPU")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    compiled = cstorch.compile(model)

    @cstorch.trace
    def step(x):
        return compiled(x).sum()

    x = torch.randn(3, 4)
    with remat(True), pytest.warns(UserWarning, match="scan_blocks_remat has no effect while "
                                                       "scan_blocks is False"):
        step(x)
    step(x)
    assert step.captures == 2
    assert step.recaptures[-1] == ["scan_blocks_remat: True -> False"]


def test_bad_value_is_refused():
    with pytest.raises(TypeError, match="scan_blocks_remat must be a bool"):
        performance.scan_blocks_remat = "yes"
