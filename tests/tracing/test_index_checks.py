"""An index out of range in a traced step (class targets, embedding ids, gather/scatter
indices, indexing) raises as eager PyTorch would, naming the op and the user's line,
where XLA would clamp it and train silently on another class (`cstorch.tracing.index_check`,
`bridge.index_checks`)."""
import copy
import inspect

import jax
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import cerebras.pytorch as cstorch
from bridge.errors import IndexOutOfRangeError
from cstorch.tracing import index_check
from tests.models import rel_err


class Tagger(nn.Module):
    """Every kind of index a model takes: embedding ids, class targets, a gather, an
    index_select, advanced indexing and a scatter, each fed from the batch."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.head = nn.Linear(12, 5)

    def forward(self, ids, pick):
        h = self.head(self.embed(ids).flatten(1))
        h = h + torch.gather(h, 1, pick[:, None])
        h = h + torch.index_select(h, 1, pick).mean(1, keepdim=True)
        h = h + h[:, pick].mean(1, keepdim=True)
        return h + torch.zeros_like(h).scatter(1, pick[:, None], 1.0)


def _line(text):
    lines, start = inspect.getsourcelines(Tagger.forward)
    return start + next(i for i, line in enumerate(lines) if text in line)


def _batch(i, **bad):
    g = torch.Generator().manual_seed(i)
    batch = {"ids": torch.randint(0, 10, (2, 3), generator=g),
             "pick": torch.randint(0, 5, (2,), generator=g),
             "y": torch.randint(0, 5, (2,), generator=g)}
    for name, (row, value) in bad.items():
        batch[name][row] = value
    return batch


def _setup(backend="CPU"):
    torch.manual_seed(0)
    model = Tagger()
    eager = copy.deepcopy(model)
    cstorch.backend(backend)
    compiled = cstorch.compile(model)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)

    @cstorch.trace
    def step(ids, pick, y):
        loss = F.cross_entropy(compiled(ids, pick), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    return eager, step


BAD = {   # the batch entry made bad, its value, and the line of the op that takes it
    "class-target-past-the-classes": ("y", (1, 5), None),
    "class-target-minus-one": ("y", (0, -1), None),
    "embedding-id-past-the-table": ("ids", ((1, 2), 10), "self.embed(ids)"),
    "embedding-id-minus-one": ("ids", ((0, 0), -1), "self.embed(ids)"),
    "gather-index": ("pick", (0, 7), "torch.gather(h, 1, pick[:, None])"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_index_raises_like_eager_naming_the_op_and_line(case):
    name, (row, value), text = BAD[case]
    eager, step = _setup()
    good = _batch(1)
    bad = _batch(2, **{name: (row, value)})
    with pytest.raises((IndexError, RuntimeError)):   # what eager PyTorch does
        F.cross_entropy(eager(bad["ids"], bad["pick"]), bad["y"])
    step(**good)
    loss = step(**bad)
    with pytest.raises(IndexOutOfRangeError) as info:
        float(loss)   # the first read of a value after the bad step
    assert isinstance(info.value, IndexError) and isinstance(info.value, RuntimeError)
    msg = str(info.value)
    assert f"index {value} is out of bounds" in msg and "step 2 of step" in msg, msg
    where = text or "loss = F.cross_entropy(compiled(ids, pick), y)"
    assert where in msg and "test_index_checks.py" in msg, msg
    step(**good)   # reported once; the run goes on
    float(step(**good))


def test_a_bad_index_raises_two_calls_later_without_a_read():
    _, step = _setup()
    step(**_batch(1))
    step(**_batch(2, y=(0, 9)))
    with pytest.raises(IndexOutOfRangeError, match="(?s)index 9 is out of bounds.*step 2 of step"):
        for i in range(3):
            step(**_batch(3 + i))


def test_indices_in_range_train_as_eager_with_negative_indexing_and_ignore_index():
    """No false alarm: x[-1]-style indices and ignore_index=-100 are in range for eager."""
    eager, step = _setup()
    reference = torch.optim.SGD(eager.parameters(), lr=0.1)
    for i in range(4):
        b = _batch(10 + i)
        b["y"][0] = -100   # ignored, as eager ignores it
        loss = step(**b)
        want = F.cross_entropy(eager(b["ids"], b["pick"]), b["y"])
        reference.zero_grad()
        want.backward()
        reference.step()
        assert rel_err(float(loss), float(want)) < 1e-5
    index_check.raise_pending()


def test_the_check_is_off_when_asked_and_on_csx_by_default():
    flags = cstorch.backends.csx.debug
    try:
        flags.check_indices = False
        _, step = _setup()
        float(step(**_batch(1, y=(0, 9))))   # unchecked: XLA's clamped value, no error
        program = next(iter(step.programs.values()))[0]
        assert program.index_checks is None
        flags.reset()
        _, step = _setup("CSX")
        float(step(**_batch(1, y=(0, 9))))
        assert next(iter(step.programs.values()))[0].index_checks is None
        flags.check_indices = True
        _, step = _setup("CSX")
        with pytest.raises(IndexOutOfRangeError, match="index 9 is out of bounds"):
            float(step(**_batch(1, y=(0, 9))))
        with pytest.raises(TypeError, match="check_indices must be a bool"):
            flags.check_indices = "yes"
    finally:
        flags.reset()


def test_the_plain_jax_view_returns_only_the_steps_outputs():
    _, step = _setup()
    b = _batch(1)
    js = step.to_jax(**b)
    new_state, outs = jax.jit(js.fn)(*js.args)
    assert len(outs) == 1 and outs[0].shape == ()
    assert rel_err(float(outs[0]), float(step(**b))) < 1e-6


def test_negative_indexing_is_in_range_down_to_minus_the_size():
    cstorch.backend("CPU")

    @cstorch.trace
    def rows(x, idx):
        return x[idx].sum(1)

    x = torch.randn(5, 3)
    for idx in ([-1, 0, 4], [-5, 2, -3]):
        assert torch.allclose(rows(x, torch.tensor(idx)), x[torch.tensor(idx)].sum(1))
    with pytest.raises(IndexError):
        x[torch.tensor([-6])]
    with pytest.raises(IndexOutOfRangeError, match="index -6 is out of bounds for dimension 0"):
        float(rows(x, torch.tensor([-6, 0, 1]))[0])


def test_a_bad_index_in_the_last_step_of_a_loop_raises_when_the_loop_ends():
    _, step = _setup()
    batches = [_batch(1), _batch(2), _batch(3, ids=((0, 1), 11))]
    loader = cstorch.utils.data.DataLoader(lambda: batches)
    with pytest.raises(IndexOutOfRangeError, match="index 11 is out of bounds"):
        for b in cstorch.utils.data.DataExecutor(loader, num_steps=3):
            step(**b)


@pytest.mark.parametrize("shape", [(7, 5), (3,), (), (0, 4)])
def test_the_bounds_are_the_smallest_and_largest_index_with_the_initial_value(shape):
    """One reduction gives both bounds: the min and max of the indices and the initial
    value (which an empty index array leaves alone), in the program as on the host."""
    import numpy as np
    from bridge.index_checks import _smallest_and_largest
    rng = np.random.default_rng(0)
    index = rng.integers(-40, 90, size=shape).astype(np.int32)
    got = jax.jit(lambda x: _smallest_and_largest(x, 0))(index)
    values = np.append(index.reshape(-1), 0)
    assert got.dtype == np.int32
    assert got.tolist() == [int(values.min()), int(values.max())]
