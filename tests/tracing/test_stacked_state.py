"""With `scan_blocks`, a loop's per-layer parameters and the optimizer state updated
alongside them are held stacked (`bridge.stacked_state`, `cstorch.tracing.state_slots`):
the program takes one array per kind, the state stays owned by name, and training equals
eager PyTorch's, also with reads and `.data` writes between steps."""
import copy
import gc
import re
import weakref
from unittest.mock import patch

import jax
import numpy as np
import pytest
import torch

import cerebras.pytorch as cstorch
from bridge.device_tensor import Row
from cstorch.tracing import state_slots
from cstorch.tracing.capture import KEEP_MIN_BYTES
from tests.bridge.test_scan_blocks import VOCAB, Block, Model, _batches, _loss
from tests.models import rel_err
from tests.tracing.test_donation import _copied_entry_parameters

LAYERS = 4


def _adamw(module, model):
    return module.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)


@pytest.fixture
def scan_blocks():
    before = cstorch.backends.csx.performance.scan_blocks
    cstorch.backends.csx.performance.scan_blocks = True
    yield
    cstorch.backends.csx.performance.scan_blocks = before


def _traced(model):
    cstorch.backend("CPU")
    compiled = cstorch.compile(model)
    optimizer = _adamw(cstorch.optim, model)

    @cstorch.trace
    def step(tokens):
        loss = _loss(compiled, tokens)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss
    return step, optimizer


def _eager(model, batches, between=None):
    optimizer = _adamw(cstorch.optim, model)
    losses = []
    for k, tokens in enumerate(batches):
        if between is not None and k == 1:
            between(model, optimizer)
        loss = _loss(model, tokens)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return torch.stack(losses), optimizer


def _program(step):
    (program,) = [p for ps in step.programs.values() for p in ps]
    return program


def _state_inputs(step) -> int:
    text = _program(step).compiled.lowered.as_text()
    main = re.search(r"func\.func public @main\((.*?)\) ->", text, re.S).group(1)
    return main.count("%arg")


def _compare(model, reference, optimizer, ref_optimizer):
    for (name, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
        assert rel_err(p.detach(), q.detach()) < 1e-4, name
    ours, theirs = optimizer.state_dict()["state"], ref_optimizer.state_dict()["state"]
    assert ours.keys() == theirs.keys()
    for i in theirs:
        for key, value in theirs[i].items():
            if isinstance(value, torch.Tensor):
                assert rel_err(ours[i][key], value) < 1e-4, (i, key)


def _trained_as_eager(model, batches):
    """The traced step, after it trained `model` on `batches` as eager PyTorch trains a
    copy of it (losses, parameters and optimizer state compared)."""
    reference = copy.deepcopy(model)
    step, optimizer = _traced(model)
    losses = torch.stack([step(t).detach().clone() for t in batches])
    ref_losses, ref_optimizer = _eager(reference, batches)
    assert rel_err(losses, ref_losses) < 1e-4
    _compare(model, reference, optimizer, ref_optimizer)
    return step


def test_looped_layers_state_is_stacked_and_trains_as_eager(scan_blocks):
    torch.manual_seed(0)
    step = _trained_as_eager(Model(layers=LAYERS), _batches())

    program = _program(step)
    names = program.names
    groups = [s for s in program.slots if type(s) is not int]
    # Each of a layer's 12 parameters, with its two moments: one array for all 4 layers.
    assert len(groups) >= 3 * 12
    assert all(len(g) == LAYERS for g in groups)
    stacked = {names[i] for g in groups for i in g}
    for k in range(LAYERS):
        assert f"model.blocks.{k}.qkv.weight" in stacked
    for g in groups:   # a group is one tensor of each layer, in the layers' order
        layer_of = [re.search(r"blocks\.(\d+)\.", names[i]) for i in g]
        if all(layer_of):
            assert [int(m.group(1)) for m in layer_of] == list(range(LAYERS))
            assert len({re.sub(r"blocks\.\d+\.", "", names[i]) for i in g}) == 1


def test_stacked_program_takes_fewer_arrays_than_the_unrolled_one(scan_blocks):
    torch.manual_seed(0)
    model = Model(layers=LAYERS)
    other = copy.deepcopy(model)
    batches = _batches(1)
    step, _ = _traced(model)
    step(batches[0])
    stacked_inputs = _state_inputs(step)
    cstorch.backends.csx.performance.scan_blocks = False
    step2, _ = _traced(other)
    step2(batches[0])
    unrolled_inputs = _state_inputs(step2)
    groups = [s for s in _program(step).slots if type(s) is not int]
    assert groups
    assert unrolled_inputs - stacked_inputs == sum(len(g) - 1 for g in groups)


def test_reads_and_data_writes_between_steps(scan_blocks):
    torch.manual_seed(0)
    model = Model(layers=LAYERS)
    reference = copy.deepcopy(model)
    batches = _batches()
    step, optimizer = _traced(model)
    seen = {}

    def between(m, opt):
        # A read of one layer's parameter and moment, then writes to another layer's.
        seen["weight"] = m.blocks[2].qkv.weight.detach().clone()
        first = next(iter(opt.state.values()))
        seen["exp_avg"] = first["exp_avg"].detach().clone()
        with torch.no_grad():
            m.blocks[1].ff1.weight.data.mul_(0.5)
            opt.state[m.blocks[3].proj.weight]["exp_avg"].zero_()

    losses = []
    for k, tokens in enumerate(batches):
        if k == 1:
            between(model, optimizer)
            ours = dict(seen)
        losses.append(step(tokens).detach().clone())
    ref_losses, ref_optimizer = _eager(reference, batches, between)
    assert rel_err(ours["weight"], seen["weight"]) < 1e-4
    assert rel_err(ours["exp_avg"], seen["exp_avg"]) < 1e-4
    assert rel_err(torch.stack(losses), ref_losses) < 1e-4
    _compare(model, reference, optimizer, ref_optimizer)
    assert step.captures == 1


def test_cells_hold_rows_of_the_returned_arrays(scan_blocks):
    torch.manual_seed(0)
    model = Model(layers=LAYERS)
    step, _ = _traced(model)
    for t in _batches(2):
        step(t)
    state = model.blocks[0].qkv.weight.cell.store
    rows = [a for a in state if type(a) is Row]
    assert rows, "no state is held stacked"
    stacks = {id(r.stack) for r in rows}
    assert len(stacks) < len(rows)
    # Reading a row gives that layer's values and makes it an array of its own.
    weight = model.blocks[2].qkv.weight
    index = weight.cell.index
    row = state[index]
    assert type(row) is Row and row.k == 2
    expected = np.asarray(row.stack)[2]
    np.testing.assert_array_equal(weight.detach().numpy(), expected)
    assert type(state[index]) is not Row


def test_to_jax_of_a_stacked_step(scan_blocks):
    torch.manual_seed(0)
    model = Model(layers=LAYERS)
    batches = _batches(2)
    step, _ = _traced(model)
    step(batches[0])
    view = step.to_jax(batches[1])
    new_state, (loss,) = jax.jit(view.fn)(*view.args)
    got = step(batches[1])
    # (XLA fuses the two compiles apart, and Adam's division carries the last bits)
    assert rel_err(torch.tensor(float(loss)), got.detach()) < 1e-6
    for name, p in model.named_parameters():
        assert rel_err(torch.tensor(np.asarray(new_state[f"model.{name}"])), p.detach()) \
            < 1e-5, name


def test_a_program_taking_cells_one_by_one_after_a_stacked_one(scan_blocks):
    torch.manual_seed(0)
    model = Model(layers=LAYERS)
    reference = copy.deepcopy(model)
    batches = _batches(3)
    step, optimizer = _traced(model)

    @cstorch.trace
    def squares():   # no layer runs: no loop, every parameter taken on its own
        with torch.no_grad():
            return sum(p.square().sum() for p in model.parameters())

    got = []
    for t in batches:
        step(t)
        got.append(float(squares()))
    ref_optimizer = _adamw(cstorch.optim, reference)
    expected = []
    for t in batches:
        loss = _loss(reference, t)
        ref_optimizer.zero_grad()
        loss.backward()
        ref_optimizer.step()
        with torch.no_grad():
            expected.append(float(sum(p.square().sum() for p in reference.parameters())))
    assert rel_err(torch.tensor(got), torch.tensor(expected)) < 1e-4
    assert step.captures == 1


class Layer(torch.nn.Module):
    def __init__(self, width=128):
        super().__init__()
        self.fc = torch.nn.Linear(width, width)

    def forward(self, x):
        return torch.tanh(self.fc(x))


def _deep():
    # Gradients of 64 KiB on average: returned one array each, not packed into one
    # (grad_packing), so the layers' are returned stacked. The first layer's input needs
    # a gradient as the others' do, so that their gradients are one loop.
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(128, 128), *[Layer() for _ in range(LAYERS)])


@pytest.mark.parametrize("zero_grad", [True, False], ids=["AdamW", "accumulated"])
def test_gradients_returned_stacked(scan_blocks, zero_grad):
    # With zero_grad, AdamW steps; without, each call adds to the gradients the previous
    # one left, which it takes as inputs (rows of that call's stacked output).
    model = _deep()
    reference = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randn(8, 128, generator=gen) for _ in range(3)]
    cstorch.backend("CPU")
    compiled = cstorch.compile(model)
    optimizer = _adamw(cstorch.optim, model)
    ref_optimizer = _adamw(cstorch.optim, reference)

    @cstorch.trace
    def step(x):
        loss = compiled(x).square().mean()
        if zero_grad:
            optimizer.zero_grad()
        loss.backward()
        if zero_grad:
            optimizer.step()
        return loss

    for x in batches:
        step(x)
        loss = reference(x).square().mean()
        if zero_grad:
            ref_optimizer.zero_grad()
        loss.backward()
        if zero_grad:
            ref_optimizer.step()
    for (name, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
        assert rel_err(p.grad, q.grad) < 1e-4, name
        assert rel_err(p.detach(), q.detach()) < 1e-4, name
    for programs in step.programs.values():
        for program in programs:   # (without zero_grad, the first call has no gradients)
            rows = [w for w in program.grad_layout if w[2] is None and w[1] is not None]
            assert {w[1] for w in rows} == set(range(LAYERS)) and len(rows) == 2 * LAYERS


def test_another_looped_program_reads_one_cell_of_a_stacked_group(scan_blocks):
    # The second program loops over the layers too (its own stacked parameters), and
    # takes one layer's moment on its own, a row of the training step's stacked moments.
    torch.manual_seed(0)
    model = Model(layers=LAYERS)
    reference = copy.deepcopy(model)
    batches = _batches(2)
    step, optimizer = _traced(model)
    compiled = model   # compiled in place: the module the step closes over

    @cstorch.trace
    def probe(tokens):
        with torch.no_grad():
            loss = _loss(compiled, tokens)
        moment = optimizer.state[model.blocks[1].qkv.weight]["exp_avg"]
        return loss, moment * 1

    step(batches[0])
    probe(batches[1])   # captured here: its capture reads every cell
    step(batches[1])    # the training step's cells hold rows again
    loss, moment = probe(batches[1])
    assert probe.captures == 1 and step.captures == 1
    ref_optimizer = _adamw(cstorch.optim, reference)
    for t in batches:
        ref = _loss(reference, t)
        ref_optimizer.zero_grad()
        ref.backward()
        ref_optimizer.step()
    with torch.no_grad():
        ref_loss = _loss(reference, batches[1])
    ref_moment = ref_optimizer.state[reference.blocks[1].qkv.weight]["exp_avg"]
    assert rel_err(loss.detach(), ref_loss) < 1e-4
    assert rel_err(moment, ref_moment) < 1e-4
    assert any(type(s) is not int for ps in probe.programs.values() for p in ps
               for s in p.slots or ())


def test_groups_are_stacked_by_one_program_off_the_host():
    # The path for non-CPU devices (the CPU's stacks with numpy), checked here on CPU.
    rng = np.random.default_rng(0)
    groups = [[jax.numpy.asarray(rng.standard_normal((3, 2)), jax.numpy.float32)
               for _ in range(4)],
              [jax.numpy.asarray(rng.standard_normal(5), jax.numpy.float32) for _ in range(2)]]
    for got, group in zip(state_slots._stack_groups(groups), groups):
        np.testing.assert_array_equal(np.asarray(got), np.stack([np.asarray(a) for a in group]))
    for got, group in zip(state_slots._stack_all(groups), groups):
        np.testing.assert_array_equal(np.asarray(got), np.stack([np.asarray(a) for a in group]))


def test_stacking_a_group_frees_its_cells_own_arrays_before_the_next_group():
    # The cells' own arrays would otherwise live on beside the stacked copies until the
    # step returns: a 153M-parameter GPT's looped first step peaked 0.3-0.5 GB higher.
    rng = np.random.default_rng(0)
    first = [jax.device_put(rng.standard_normal((3, 2)).astype(np.float32)) for _ in range(4)]
    second = [jax.device_put(rng.standard_normal(5).astype(np.float32)) for _ in range(2)]
    expected = [np.stack([np.asarray(a) for a in g]) for g in (first, second)]
    arrays = [jax.device_put(np.float32(7.0)), *first, *second]
    program_slots = (0, (1, 2, 3, 4), (5, 6))
    freed = []
    stack = state_slots._stack_all

    def stack_and_look(groups):   # how many of the first group's arrays still exist
        freed.append(sum(r() is None for r in refs))
        return stack(groups)

    refs = [weakref.ref(a) for a in first]
    del first, second
    with patch.object(state_slots, "_stack_all", stack_and_look):
        out = state_slots.arguments(program_slots, arrays)
    gc.collect()
    assert freed == [0, 4]   # all of the first group's arrays were freed before the second was stacked
    assert float(out[0]) == 7.0
    for got, want in zip(out[1:], expected):
        np.testing.assert_array_equal(np.asarray(got), want)
    # The cells hold rows of the stacked arrays, which the call passes on as they are.
    assert all(type(arrays[i]) is Row and arrays[i].stack is out[1] for i in (1, 2, 3, 4))
    assert [np.asarray(arrays[i].read()).tolist() for i in (5, 6)] == expected[1].tolist()
    assert state_slots.arguments(program_slots, arrays)[1] is out[1]


def test_large_layer_weights_are_donated_stacked_not_kept_and_not_copied(scan_blocks):
    # On the CPU a large parameter read after its update could be made (by the backward
    # pass) is kept rather than donated (tests/tracing/test_donation.py). A loop's layers
    # read their rows before the update of the stacked array can start: donated, it is
    # updated in place with no copy, where a kept member made the program stack its
    # group from the cells, a copy of every layer's weight each step.
    torch.manual_seed(0)
    blocks = [Block(dim=256, hidden=512) for _ in range(LAYERS)]
    model = Model(blocks=blocks)
    model.tok, model.ln = torch.nn.Embedding(VOCAB, 256), torch.nn.LayerNorm(256)
    model.head = torch.nn.Linear(256, VOCAB)
    unrolled = copy.deepcopy(model)
    batches = _batches(2)
    program = _program(_trained_as_eager(model, batches))
    layer_cells = {i for i, name in enumerate(program.names) if ".blocks." in name}
    assert not layer_cells.intersection(program.compiled.kept)
    stacked = {program.names[i] for s in program.slots if type(s) is not int for i in s}
    assert {f"model.blocks.{k}.ff1.weight" for k in range(LAYERS)} <= stacked
    # XLA copies small donated inputs (the layers' step counts, say), no weight.
    hlo = program.compiled.executable.as_text()
    copied = _copied_entry_parameters(hlo)
    assert copied
    for name in copied:
        dims = re.search(rf"%{re.escape(name)} = f32\[([\d,]*)\]", hlo).group(1)
        assert 4 * np.prod([int(d) for d in dims.split(",") if d]) < KEEP_MIN_BYTES, name

    # Unrolled, the same weights are kept: the case the looped program donates.
    cstorch.backends.csx.performance.scan_blocks = False
    step, _ = _traced(unrolled)
    step(batches[0])
    kept = {_program(step).names[i] for i in _program(step).compiled.kept}
    assert {f"model.blocks.{k}.ff1.weight" for k in range(LAYERS)} <= kept, kept
