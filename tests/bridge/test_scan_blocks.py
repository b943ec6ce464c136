"""Identical layers compile as one loop (bridge.repeated_blocks, bridge.scan_blocks): the
program equals the unrolled one and eager PyTorch; state stays owned by name."""
import copy
import logging
import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import cerebras.pytorch as cstorch
from bridge import scan_blocks
from bridge.repeated_blocks import find_runs
from tests.models import rel_err

DIM, HEADS, LAYERS, VOCAB, T = 16, 2, 3, 23, 8


class Block(nn.Module):
    """Pre-norm attention and MLP with dropout: a decoder layer in small."""

    def __init__(self, dim=DIM, hidden=2 * DIM, p=0.0):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.ff1, self.ff2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)
        self.drop = nn.Dropout(p)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, HEADS, d // HEADS).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / (d // HEADS) ** 0.5
        att = att.masked_fill(torch.ones(t, t).tril() == 0, float("-inf"))
        y = (self.drop(att.softmax(-1)) @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.drop(self.proj(y))
        return x + self.drop(self.ff2(F.gelu(self.ff1(self.ln2(x)))))


class Model(nn.Module):
    def __init__(self, p=0.0, layers=LAYERS, blocks=None):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(blocks or [Block(p=p) for _ in range(layers)])
        self.ln = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, idx):
        x = self.tok(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def _loss(model, tokens):
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


def _batches(n=3):
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(0, VOCAB, (2, T + 1), generator=gen) for _ in range(n)]


def _groups(model, lr=1e-3):
    """One param group per layer, each with its own learning rate, and one for the rest."""
    layer_ids = {id(p) for p in model.blocks.parameters()}
    groups = [{"params": list(b.parameters()), "lr": lr * (k + 1)}
              for k, b in enumerate(model.blocks)]
    return groups + [{"params": [p for p in model.parameters() if id(p) not in layer_ids]}]


def _sgd(module, model):
    # Not Adam, which divides by the gradients' size: rounding in a near-zero gradient
    # (XLA fuses a loop's body otherwise than the same ops unrolled, and than eager) would
    # move a parameter by a good part of a step.
    return module.SGD(_groups(model, lr=0.05), lr=0.05, momentum=0.9)


def _train(model, scan, batches, data_write=None):
    """Losses, state and compiled program of the steps traced with scan_blocks=`scan`."""
    before = cstorch.backends.csx.performance.scan_blocks
    cstorch.backends.csx.performance.scan_blocks = scan
    try:
        cstorch.backend("CPU")
        compiled = cstorch.compile(model)
        optimizer = _sgd(cstorch.optim, model)

        @cstorch.trace
        def step(tokens):
            loss = _loss(compiled, tokens)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            return loss

        losses = []
        for k, tokens in enumerate(batches):
            if data_write is not None and k == 1:
                data_write(model)
            losses.append(step(tokens).detach().clone())
        program = next(iter(step.programs.values()))[0].compiled
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        return torch.stack(losses), state, program, step.captures
    finally:
        cstorch.backends.csx.performance.scan_blocks = before


def _whiles(program):
    return len(re.findall(r"stablehlo\.while", program.lowered.as_text()))


def _dots(program):
    return len(re.findall(r"stablehlo\.dot_general", program.lowered.as_text()))


def _temp_bytes(program):
    """XLA's scratch memory for one run of the program."""
    return program.executable.memory_analysis().temp_size_in_bytes


@pytest.mark.slow
def test_loop_equals_unrolled_program_with_dropout():
    torch.manual_seed(0)
    model = Model(p=0.2)
    other = copy.deepcopy(model)
    batches = _batches()
    losses, state, program, _ = _train(model, True, batches)
    ref_losses, ref_state, ref_program, _ = _train(other, False, batches)
    # The same program: dropout draws the same masks, each layer its own.
    assert rel_err(losses, ref_losses) < 1e-6
    assert state.keys() == ref_state.keys()
    for name in ref_state:
        assert rel_err(state[name], ref_state[name]) < 1e-6, name
    # One loop for the layers' forward ops and one for their gradients, each with the
    # body of one layer, where the unrolled program has every layer's matrix products.
    assert _whiles(program) == _whiles(ref_program) + 2
    assert _dots(program) < _dots(ref_program)


def test_loop_trains_as_eager_pytorch_with_per_layer_rates_and_data_writes():
    torch.manual_seed(0)
    model = Model()
    reference = copy.deepcopy(model)
    batches = _batches()

    def write(m):   # a write through .data between steps reaches the next step
        with torch.no_grad():
            m.blocks[1].ff1.weight.data.mul_(0.5)

    losses, state, program, captures = _train(model, True, batches, data_write=write)
    assert _whiles(program) >= 2 and captures == 1
    optimizer = _sgd(torch.optim, reference)
    ref_losses = []
    for k, tokens in enumerate(batches):
        if k == 1:
            write(reference)
        loss = _loss(reference, tokens)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        ref_losses.append(loss.detach())
    assert rel_err(losses, torch.stack(ref_losses)) < 1e-4
    theirs = reference.state_dict()
    assert list(state) == list(theirs)   # checkpoints name every layer's tensors as before
    for name in theirs:
        assert rel_err(state[name], theirs[name]) < 1e-4, name


def test_a_hook_on_one_layer_unrolls_the_run(caplog):
    torch.manual_seed(0)
    model = Model()
    reference = copy.deepcopy(model)
    for m in (model, reference):
        m.blocks[1].register_forward_hook(lambda mod, args, out: out * 0.5)
    batches = _batches(2)
    with caplog.at_level(logging.INFO, logger="bridge.scan"):
        losses, state, program, _ = _train(model, True, batches)
    assert "model.blocks.1 is not looped over with model.blocks.0" in caplog.text
    assert "forward hooks differs (1 against 0)" in caplog.text
    assert "one loop" not in caplog.text
    optimizer = _sgd(torch.optim, reference)
    for tokens, loss in zip(batches, losses):
        ref = _loss(reference, tokens)
        optimizer.zero_grad()
        ref.backward()
        optimizer.step()
        assert rel_err(loss, ref.detach()) < 1e-4


def test_gradient_loop_computes_cheap_forward_values_again_instead_of_stacking_them(
        caplog, monkeypatch):
    # The forward loop would stack, for the gradient loop, each linear layer's transposed
    # weight (a copy of every weight per step), the layer norms' and GELU's outputs and
    # the attention mask; the gradient loop computes them again from what it reads anyway.
    # With dropout: its masks are random draws, which must not be drawn again.
    torch.manual_seed(0)
    model = Model(p=0.2)
    reference = copy.deepcopy(model)
    batches = _batches(2)
    with caplog.at_level(logging.INFO, logger="bridge.scan"):
        losses, state, program, _ = _train(model, True, batches)
    found = re.search(r"compute (\d+) cheap forward values again: (\d+) of (\d+) stacked",
                      caplog.text)
    # 4 transposed weights, 2 layer norms' outputs, GELU's output, the attention mask.
    assert found and int(found.group(1)) >= 8 and int(found.group(2)) >= 8, caplog.text
    monkeypatch.setattr(scan_blocks, "recompute_cheap", lambda loops: None)
    ref_losses, ref_state, ref_program, _ = _train(reference, True, batches)
    # Less scratch memory: the dropped values were the forward loop's stacked outputs.
    assert _temp_bytes(program) < 0.85 * _temp_bytes(ref_program)
    # The same values (XLA may fuse and order an op's sums otherwise in the gradient
    # loop's body than in the forward loop's).
    assert rel_err(losses, ref_losses) < 1e-6
    for name in ref_state:
        assert rel_err(state[name], ref_state[name]) < 1e-6, name


class MaskedBlock(Block):
    """A block that drops features with a mask of its own drawing, `torch.rand` from no
    tensor: the gradient reads the mask, which the forward loop must keep."""

    def forward(self, x):
        x = super().forward(x)
        return x * (torch.rand(x.shape) > 0.3) / 0.7


def test_a_random_draw_the_gradients_read_is_kept_not_drawn_again():
    torch.manual_seed(0)
    model = Model(blocks=[MaskedBlock() for _ in range(LAYERS)])
    other = copy.deepcopy(model)
    batches = _batches(2)
    losses, state, _, _ = _train(model, True, batches)
    ref_losses, ref_state, _, _ = _train(other, False, batches)
    assert rel_err(losses, ref_losses) < 1e-6
    for name in ref_state:
        assert rel_err(state[name], ref_state[name]) < 1e-6, name


def test_layers_that_differ_are_not_a_run_and_say_why(caplog):
    blocks = [Block(), Block(), Block(hidden=3 * DIM), Block(), Block()]
    blocks[4].train(False)
    model = Model(blocks=blocks)
    with caplog.at_level(logging.INFO, logger="bridge.scan"):
        runs = find_runs(model.named_modules())
    assert [(r.name, r.first, len(r.modules)) for r in runs] == [("blocks", 0, 2)]
    assert ("blocks.2 is not looped over with blocks.0: ff1: attribute 'out_features' "
            "differs (48 against 32)") in caplog.text
    assert "train/eval mode" in caplog.text


def test_flag_is_checked_and_part_of_the_program_key():
    with pytest.raises(TypeError, match="scan_blocks must be a bool"):
        cstorch.backends.csx.performance.scan_blocks = "yes"
    from cstorch.tracing.changes import describe_key_change
    old = (None,) * 10 + (True,)
    new = (None,) * 10 + (False,)
    assert describe_key_change(old, new) == ["scan_blocks: True -> False"]


def test_the_flag_warns_where_it_cannot_loop():
    """Under debug.check_finite the layers are compiled one by one: the flag says so
    instead of doing nothing silently; the step still trains as it would without it."""
    csx = cstorch.backends.csx
    before = (csx.performance.scan_blocks, csx.debug.check_finite)
    csx.performance.scan_blocks, csx.debug.check_finite = True, True
    try:
        cstorch.backend("CPU")
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
        reference = copy.deepcopy(model)
        compiled = cstorch.compile(model)

        @cstorch.trace
        def step(x):
            return compiled(x).sum()

        x = torch.randn(3, 4)
        with pytest.warns(UserWarning, match="scan_blocks has no effect here: "
                                             "debug.check_finite is on"):
            got = float(step(x))
    finally:
        csx.performance.scan_blocks, csx.debug.check_finite = before
    assert rel_err(got, float(reference(x).sum())) < 1e-5


def test_loop_argument_leaves_are_numbered_as_pytree_numbers_them():
    """The loop finder's own walk of an op's arguments gives pytree's leaves in pytree's
    order (None is a leaf), which the loop's slots are indexed by."""
    import torch.utils._pytree as pytree
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    y = graph.placeholder("y")
    node = graph.call_function(torch.ops.aten.native_layer_norm.default,
                               (x, [DIM], None, y, 1e-5), {"extra": [None, (y, 2)]})
    leaves, _ = scan_blocks._arguments(node, check=True)
    assert leaves == pytree.tree_leaves((node.args, node.kwargs))
    assert leaves == [x, DIM, None, y, 1e-5, None, y, 2]
