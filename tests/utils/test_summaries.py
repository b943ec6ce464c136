"""summarize_scalar and summarize_tensor inside traced steps, written to the executor's
SummaryWriter, read back by our reader and by TensorBoard's own EventAccumulator."""
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


def test_summaries_in_a_traced_step_are_written_every_step_on_cpu(tmp_path):
    """activation_steps does not thin summaries on the CPU backend: the real package writes
    them after every step (behaviour.json data_executor notes)."""
    step = _step()
    writer = SummaryWriter(str(tmp_path), base_step=100)
    with pytest.warns(FutureWarning, match="writer"):
        executor = DataExecutor(_loader(), num_steps=5, writer=writer, activation_steps=2)
    results = [step(x) for x in executor]
    writer.close()
    assert step.captures == 1
    fetched = [1, 2, 3, 4, 5]
    reader = SummaryReader(str(tmp_path))
    scalars = reader.read_scalar("train/loss")
    assert [e.step for e in scalars] == [100 + s for s in fetched]
    assert [e.value for e in scalars] == pytest.approx([float(results[s - 1][0]) for s in fetched])
    tensors = reader.read_tensor("train/out")
    assert [t.step for t in tensors] == [100 + s for s in fetched]
    for t, s in zip(tensors, fetched):
        assert torch.equal(t.tensor, results[s - 1][1].detach().cpu())

    acc = EventAccumulator(str(tmp_path), size_guidance={"tensors": 0, "scalars": 0}).Reload()
    tags = acc.Tags()
    assert "train/loss" in tags["tensors"] + tags["scalars"]
    loss_events = acc.Tensors("train/loss") if "train/loss" in tags["tensors"] else acc.Scalars("train/loss")
    assert [e.step for e in loss_events] == [100 + s for s in fetched]
    out_events = acc.Tensors("train/out")
    from tensorboard.util import tensor_util
    assert torch.equal(torch.from_numpy(tensor_util.make_ndarray(out_events[-1].tensor_proto)),
                       results[4][1].detach().cpu())


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
    assert [(e.step, e.value) for e in events] == [(1, 0.0), (2, 2.5)]
    with pytest.raises(ValueError, match="use summarize_tensor"):
        cstorch.summarize_scalar("x", torch.zeros(3))
    with pytest.raises(TypeError, match="non-empty str name"):
        cstorch.summarize_scalar(3, 1.0)
    with pytest.raises(TypeError, match="takes a tensor"):
        cstorch.summarize_tensor("x", [1, 2])
