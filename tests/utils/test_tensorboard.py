"""cstorch.utils.tensorboard: what SummaryWriter puts in real event files reads back equal
through SummaryReader and through TensorBoard's own EventAccumulator."""
import ml_dtypes
import numpy as np
import pytest
import torch
import torch.utils.tensorboard
from tensorboard.backend.event_processing import event_accumulator, plugin_event_accumulator
from tensorboard.util import tensor_util

import cerebras.pytorch as cstorch
from cstorch.utils.tensorboard import TENSOR_PLUGIN_NAME, SummaryReader, SummaryWriter

SCALAR_STEPS = [0, 3, 7, 20]


def _tensors():
    g = torch.Generator().manual_seed(0)
    return {
        "weights/float32": torch.randn(3, 4, 5, generator=g),
        "weights/float64": torch.randn(7, generator=g, dtype=torch.float64),
        "weights/float16": torch.randn(2, 3, generator=g).half(),
        "weights/bfloat16": torch.randn(4, 6, generator=g).bfloat16(),
        "stats/int64": torch.randint(-(2**40), 2**40, (5, 2), generator=g),
        "stats/int32": torch.randint(-1000, 1000, (3,), generator=g, dtype=torch.int32),
        "stats/uint8": torch.randint(0, 256, (4,), generator=g, dtype=torch.uint8),
        "stats/bool": torch.rand(2, 2, 2, generator=g) > 0.5,
        "stats/zero_dim": torch.tensor(2.5),
        "stats/empty": torch.zeros(0, 3),
    }


def _scalar_value(tag, step):
    return float(np.float32(sum(map(ord, tag)) % 97 + step * 0.25))


def _write_all(log_dir):
    """Scalars (old and new style), tensors at two steps and text into one run."""
    tensors = _tensors()
    with SummaryWriter(log_dir=str(log_dir)) as writer:
        for step in SCALAR_STEPS:
            for tag in ("train/loss", "train/accuracy", "eval/loss", "lr"):
                writer.add_scalar(tag, _scalar_value(tag, step), step)
            writer.add_scalar("train/new_style", _scalar_value("new", step), step, new_style=True)
        for step in (10, 11):
            for tag, value in tensors.items():
                writer.add_tensor(tag, value + step if value.dtype != torch.bool else value, step)
        writer.add_text("notes", "first note", 1)
        writer.add_text("notes", "second note ✓", 2)
    return tensors


def _expected_tensor(tensors, tag, step):
    value = tensors[tag]
    return value + step if value.dtype != torch.bool else value


def test_scalars_read_back_with_steps(tmp_path):
    _write_all(tmp_path)
    reader = SummaryReader(str(tmp_path))

    assert reader.scalar_names() == [
        "eval/loss", "lr", "train/accuracy", "train/loss", "train/new_style",
    ]
    assert reader.scalar_groups() == ["eval", "train"]
    for tag in ("train/loss", "train/accuracy", "eval/loss", "lr"):
        events = reader.read_scalar(tag)
        assert [e.step for e in events] == SCALAR_STEPS
        assert [e.value for e in events] == [_scalar_value(tag, s) for s in SCALAR_STEPS]
    # Written as a "scalars"-plugin tensor rather than a simple_value.
    events = reader.read_scalar("train/new_style")
    assert [(e.step, e.value) for e in events] == [
        (s, _scalar_value("new", s)) for s in SCALAR_STEPS
    ]

    (at_7,) = reader.read_scalar("train/loss", step=7)
    assert (at_7.step, at_7.value) == (7, _scalar_value("train/loss", 7))
    assert reader.read_scalar("train/loss", step=5) == []

    run = str(tmp_path)
    assert list(reader.Tags()) == [run]
    assert [e.value for e in reader.Scalars(run, "train/loss")] == [
        _scalar_value("train/loss", s) for s in SCALAR_STEPS
    ]
    assert [e.step for e in reader.Scalars(run, "train/new_style")] == SCALAR_STEPS


def test_tensors_read_back_equal(tmp_path):
    tensors = _write_all(tmp_path)
    reader = SummaryReader(tmp_path)

    # Scalars (both styles) and text are not tensors.
    assert reader.tensor_names() == sorted(tensors)
    for tag in tensors:
        events = reader.read_tensor(tag)
        assert [e.step for e in events] == [10, 11]
        for event in events:
            expected = _expected_tensor(tensors, tag, event.step)
            if expected.dtype == torch.bfloat16:
                # Stored widened to float32, which holds every bfloat16 value exactly.
                assert event.tensor.dtype == torch.float32
                expected = expected.float()
            assert event.tensor.dtype == expected.dtype, tag
            assert event.tensor.shape == expected.shape, tag
            assert torch.equal(event.tensor, expected), tag

    (only,) = reader.read_tensor("weights/float32", step=11)
    assert torch.equal(only.tensor, tensors["weights/float32"] + 11)
    assert reader.read_tensor("weights/float32", step=3) == []


def test_add_tensor_accepts_numpy_and_ml_dtypes(tmp_path):
    bf16 = np.array([[1.5, -2.25], [3.0, 0.0078125]], dtype=ml_dtypes.bfloat16)
    ints = np.arange(12, dtype=np.int16).reshape(3, 4)
    with SummaryWriter(tmp_path) as writer:
        writer.add_tensor("np/bf16", bf16, 0)
        writer.add_tensor("np/int16", ints, 0)
        writer.add_tensor("np/python", [[1.0, 2.0]], 0)
        with pytest.raises(TypeError, match="add_text"):
            writer.add_tensor("np/strings", np.array(["a", "b"]), 0)
    reader = SummaryReader(tmp_path)
    assert reader.tensor_names() == ["np/bf16", "np/int16", "np/python"]
    widened = torch.from_numpy(bf16.astype(np.float32))
    assert torch.equal(reader.read_tensor("np/bf16")[0].tensor, widened)
    assert torch.equal(reader.read_tensor("np/int16")[0].tensor, torch.from_numpy(ints))
    assert reader.read_tensor("np/python")[0].tensor.tolist() == [[1.0, 2.0]]


def test_text_summaries(tmp_path):
    _write_all(tmp_path)
    reader = SummaryReader(tmp_path)
    assert reader.text_summary_names() == ["notes"]
    events = reader.read_text_summary("notes")
    assert [(e.step, e.text) for e in events] == [(1, "first note"), (2, "second note ✓")]
    (second,) = reader.read_text_summary("notes/text_summary", step=2)
    assert second.text == "second note ✓"
    assert "notes" not in reader.scalar_names() + reader.tensor_names()


def test_filter_keeps_matching_groups(tmp_path):
    with SummaryWriter(tmp_path) as writer:
        for tag in ("train/loss", "training/acc", "eval/loss", "train_loss", "x/train/y"):
            writer.add_scalar(tag, 1.0, 0)
        writer.add_tensor("train/w", torch.ones(2), 0)
        writer.add_tensor("eval/w", torch.ones(2), 0)
        writer.add_text("eval/report", "kept: text is not filtered", 0)

    reader = SummaryReader(tmp_path, filter="train")
    assert reader.scalar_names() == ["train/loss", "training/acc"]
    assert reader.scalar_groups() == ["train", "training"]
    assert reader.tensor_names() == ["train/w"]
    assert reader.text_summary_names() == ["eval/report"]
    with pytest.raises(KeyError, match="train/loss"):
        reader.read_scalar("eval/loss")
    with pytest.raises(KeyError):
        reader.read_tensor("eval/w")

    everything = SummaryReader(tmp_path)
    assert len(everything.scalar_names()) == 5
    assert everything.scalar_groups() == ["eval", "train", "training", "x"]


def test_multiple_log_dirs_and_nested_runs(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    with SummaryWriter(first) as writer:
        for step in range(3):
            writer.add_scalar("loss", float(step), step)
        writer.add_tensor("act", torch.arange(3), 1)
        # add_scalars writes each series into its own sub-directory (a nested run).
        writer.add_scalars("pair", {"a": 1.0, "b": 2.0}, 0)
    with SummaryWriter(second, base_step=3) as writer:
        for step in range(3, 6):
            writer.add_scalar("loss", float(step), step)
        writer.add_tensor("act", torch.arange(3) * 2, 4)
    with SummaryWriter(second / "nested") as writer:
        writer.add_scalar("nested/only", 9.0, 2)

    reader = SummaryReader([str(first), str(second)])
    runs = set(reader.Tags())
    assert {str(first), str(second), str(second / "nested")} <= runs
    assert any(r.startswith(str(first / "pair_")) for r in runs)

    # A name found in several runs reads back merged, in step order.
    assert [(e.step, e.value) for e in reader.read_scalar("loss")] == [
        (s, float(s)) for s in range(6)
    ]
    assert sorted(e.value for e in reader.read_scalar("pair")) == [1.0, 2.0]
    assert reader.read_scalar("nested/only")[0].value == 9.0
    acts = reader.read_tensor("act")
    assert [e.step for e in acts] == [1, 4]
    assert torch.equal(acts[1].tensor, torch.arange(3) * 2)
    assert [e.step for e in reader.Scalars(str(second), "loss")] == [3, 4, 5]


def test_reload_picks_up_new_events_and_runs(tmp_path):
    reader = SummaryReader(tmp_path / "run")  # does not exist yet
    assert reader.scalar_names() == []
    with SummaryWriter(tmp_path / "run") as writer:
        writer.add_scalar("a/b", 1.0, 0)
        writer.flush()
        assert reader.reload() is reader
        assert [e.value for e in reader.read_scalar("a/b")] == [1.0]
        writer.add_scalar("a/b", 2.0, 1)
    reader.reload()
    assert [e.value for e in reader.read_scalar("a/b")] == [1.0, 2.0]


def test_size_guidance_keeps_every_event(tmp_path):
    # TensorBoard's defaults would sample tensors down to 10 per tag.
    with SummaryWriter(tmp_path) as writer:
        for step in range(30):
            writer.add_tensor("t", torch.tensor([step]), step)
    assert [e.step for e in SummaryReader(tmp_path).read_tensor("t")] == list(range(30))
    sampled = SummaryReader(tmp_path, size_guidance={event_accumulator.TENSORS: 5})
    assert len(sampled.read_tensor("t")) == 5


@pytest.mark.parametrize(
    "accumulator_cls",
    [event_accumulator.EventAccumulator, plugin_event_accumulator.EventAccumulator],
    ids=["event_accumulator", "plugin_event_accumulator"],
)
def test_tensorboard_reads_our_files(tmp_path, accumulator_cls):
    tensors = _write_all(tmp_path)
    accumulator = accumulator_cls(
        str(tmp_path), size_guidance=event_accumulator.STORE_EVERYTHING_SIZE_GUIDANCE
    )
    accumulator.Reload()

    def scalar_events(tag):
        if accumulator_cls is event_accumulator.EventAccumulator:
            return [(e.step, e.value) for e in accumulator.Scalars(tag)]
        # TensorBoard's own plugin accumulator keeps scalars as "scalars"-plugin tensors.
        assert accumulator.SummaryMetadata(tag).plugin_data.plugin_name == "scalars"
        return [
            (e.step, float(tensor_util.make_ndarray(e.tensor_proto)))
            for e in accumulator.Tensors(tag)
        ]

    for tag in ("train/loss", "eval/loss", "lr"):
        assert scalar_events(tag) == [(s, _scalar_value(tag, s)) for s in SCALAR_STEPS]

    for tag in tensors:
        metadata = accumulator.SummaryMetadata(tag)
        assert metadata.plugin_data.plugin_name == TENSOR_PLUGIN_NAME
        events = accumulator.Tensors(tag)
        assert [e.step for e in events] == [10, 11]
        for event in events:
            expected = _expected_tensor(tensors, tag, event.step)
            if expected.dtype == torch.bfloat16:
                expected = expected.float()
            np.testing.assert_array_equal(
                tensor_util.make_ndarray(event.tensor_proto), expected.numpy(), err_msg=tag
            )


def test_writer_is_torch_writer_with_base_step(tmp_path):
    writer = SummaryWriter(tmp_path / "a", base_step=5)
    try:
        assert isinstance(writer, torch.utils.tensorboard.SummaryWriter)
        assert writer.base_step == 5
        assert str(writer.get_logdir()) == str(tmp_path / "a")
        assert SummaryWriter(tmp_path / "b").base_step == 0
        writer.base_step = np.int64(7)
        assert writer.base_step == 7 and type(writer.base_step) is int
        assert str(tmp_path / "a") in writer.cs_events_dir
        with pytest.raises(ValueError):
            writer.base_step = -2
        assert writer.base_step == 7
    finally:
        writer.close()


@pytest.mark.parametrize("bad", [-1, 1.5, "3", True, None])
def test_bad_base_step_is_rejected_before_writing(tmp_path, bad):
    with pytest.raises(ValueError if bad == -1 else TypeError, match="base_step"):
        SummaryWriter(tmp_path / "never", base_step=bad)
    assert not (tmp_path / "never").exists()


def test_unknown_names_raise_key_error_listing_available(tmp_path):
    _write_all(tmp_path)
    reader = SummaryReader(tmp_path)
    with pytest.raises(KeyError, match=r"no_such.*train/loss"):
        reader.read_scalar("no_such")
    with pytest.raises(KeyError, match=r"weights/float32"):
        reader.read_tensor("train/loss")  # a scalar, not a tensor
    with pytest.raises(KeyError, match="notes"):
        reader.read_text_summary("nope")
    with pytest.raises(KeyError):
        reader.Scalars(str(tmp_path), "weights/float32")
    with pytest.raises(KeyError):
        reader.Scalars("not-a-run", "train/loss")
    with pytest.raises(TypeError):
        SummaryReader(42)


def test_reachable_as_cerebras_pytorch_utils_tensorboard():
    import cerebras.pytorch.utils.tensorboard as aliased
    import cstorch.utils.tensorboard as module

    assert aliased is module
    assert aliased.SummaryWriter is SummaryWriter and aliased.SummaryReader is SummaryReader
    # `cstorch.utils` does not import the module eagerly; its __getattr__ supplies it.
    utils = cstorch.utils
    del utils.tensorboard
    try:
        assert "tensorboard" not in vars(utils)
        assert utils.tensorboard is module
    finally:
        utils.tensorboard = module
    with pytest.raises(AttributeError):
        utils.no_such_submodule  # pylint: disable=pointless-statement
