"""summarize_scalar and summarize_tensor inside traced steps, written to the executor's
SummaryWriter, read back by our reader and by TensorBoard's own EventAccumulator."""
import os

import pytest
import torch
import torch.nn as nn
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import cerebras.pytorch as cstorch
from cerebras.pytorch.utils.data import DataExecutor, DataLoader
from cerebras.pytorch.utils.tensorboard import SummaryReader, SummaryWriter


def _step():
    cstorch.backend("CPU")
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    compiled = cstorch.compile(model)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)

    @cstorch.trace
    def step(x):
        out = compiled(x)
        loss = out.square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        cstorch.summarize_scalar("train/loss", loss)
        cstorch.summarize_tensor("train/out", out)
        return loss, out

    return step


def _loader():
    g = torch.Generator().manual_seed(3)
    data = [torch.randn(2, 4, generator=g) for _ in range(5)]
    return DataLoader(lambda: data)


@pytest.mark.parametrize("base_step", [None, 100])
def test_summaries_in_a_traced_step_are_written_every_step_on_cpu(tmp_path, base_step):
    """activation_steps does not thin summaries on the CPU backend: the real package writes
    them after every step (behaviour.json data_executor notes)."""
    step = _step()
    # The writer's base_step (1 unless given, as in the real package) is the step of the
    # executor's first step: step index i (0-based) is written at base_step + i.
    writer = SummaryWriter(str(tmp_path), **({} if base_step is None else {"base_step": base_step}))
    first = 1 if base_step is None else base_step
    with pytest.warns(FutureWarning, match="writer"):
        executor = DataExecutor(_loader(), num_steps=5, writer=writer, activation_steps=2)
    results = [step(x) for x in executor]
    writer.close()
    assert step.captures == 1
    fetched = [1, 2, 3, 4, 5]
    steps = [first + s - 1 for s in fetched]
    reader = SummaryReader(str(tmp_path))
    scalars = reader.read_scalar("train/loss")
    assert [e.step for e in scalars] == steps
    assert [e.value for e in scalars] == pytest.approx([float(results[s - 1][0]) for s in fetched])
    tensors = reader.read_tensor("train/out")
    assert list(tensors) == steps
    for t, s in zip(tensors.values(), fetched):
        assert torch.equal(t.tensor, results[s - 1][1].detach().cpu())

    # TensorBoard sees the scalars; tensors are .pt files beside the event file, as the
    # real package writes them, not event-file summaries.
    acc = EventAccumulator(str(tmp_path), size_guidance={"tensors": 0, "scalars": 0}).Reload()
    assert acc.Tags()["scalars"] == ["train/loss"] and acc.Tags()["tensors"] == []
    assert [e.step for e in acc.Scalars("train/loss")] == steps
    out_dir = os.path.join(writer.cs_events_dir, "tensors", "train", "out")
    saved = sorted(torch.load(os.path.join(out_dir, f))["step"] for f in os.listdir(out_dir))
    assert saved == steps


def test_summaries_without_a_writer_warn_once():
    step = _step()
    x = torch.ones(2, 4)
    with pytest.warns(UserWarning, match="summarize_scalar\\('train/loss'\\) is not written"):
        for batch in DataExecutor(DataLoader(lambda: [x]), num_steps=2):
            step(batch)


def test_eager_summaries_and_bad_arguments(tmp_path):
    cstorch.backend("CPU")
    writer = SummaryWriter(str(tmp_path))
    with pytest.warns(FutureWarning):
        executor = DataExecutor(DataLoader(lambda: [0, 1]), writer=writer)
    for i in executor:
        cstorch.summarize_scalar("eager/value", torch.tensor([2.5 * i]))
    writer.close()
    events = SummaryReader(str(tmp_path)).read_scalar("eager/value")
    # Outside a traced step too: base_step (default 1) + the 0-based step index.
    assert [(e.step, e.value) for e in events] == [(1, 0.0), (2, 2.5)]
    with pytest.raises(ValueError, match="use summarize_tensor"):
        cstorch.summarize_scalar("x", torch.zeros(3))
    with pytest.raises(TypeError, match="non-empty str name"):
        cstorch.summarize_scalar(3, 1.0)
    with pytest.raises(TypeError, match="takes a tensor"):
        cstorch.summarize_tensor("x", [1, 2])
