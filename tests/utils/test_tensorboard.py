"""cstorch.utils.tensorboard against the real package's `tensorboard` scenario
(../shared/fixtures/behaviour.json): the files SummaryWriter leaves, what TensorBoard's own
accumulators see in them, and what SummaryReader returns, call by call. The same reader
calls run on files written in the real package's format without this project's writer
(torch's writer for the event file, torch.save for the tensors), so files move both ways."""
import dataclasses
import datetime
import inspect
import json
import os
import re
import time

import numpy as np
import pytest
import torch
import torch.utils.tensorboard
from tensorboard.backend.event_processing import event_accumulator, plugin_event_accumulator
from tensorboard.util import tensor_util

import cerebras.pytorch as cstorch
from tests.conftest import SHARED
from cstorch.utils.tensorboard import SummaryReader, SummaryWriter

FIXTURE = json.load(open(os.path.join(SHARED, "fixtures", "behaviour.json")))["scenarios"][
    "tensorboard"]
CALLS = FIXTURE["reader_calls"]


def _write_scenario(log_dir):
    """The scenario's calls, in its order, through this project's writer."""
    w = SummaryWriter(log_dir=str(log_dir))
    w.add_scalar("train/loss", 2.5, 3)
    w.add_scalar("train/loss", 1.5, 4)
    w.add_scalar("eval/acc", 0.75, 4)
    w.add_tensor("train/w", torch.arange(4.).reshape(2, 2), 7)
    time.sleep(0.01)
    w.add_tensor("train/w", torch.arange(4.).reshape(2, 2) * 10, 7)
    w.add_tensor("train/w", torch.tensor([1, 2, 3], dtype=torch.int64), 8)
    w.add_tensor("deep/a/b", torch.tensor(5.0), 1)
    w.add_text("notes", "hello world", 2)
    w.flush()
    w.close()
    return w


def _write_real_format(log_dir):
    """The same content laid out as the fixture records the real package's files, written
    without this project's writer: torch's SummaryWriter (which the real one subclasses) for
    scalars and text, and one torch.save'd {step, ns_since_epoch, tensor} dict per tensor
    under events.out.csevents.<same suffix as the event file>/tensors/<name>/<step>.<time>.pt."""
    w = torch.utils.tensorboard.SummaryWriter(log_dir=str(log_dir))
    w.add_scalar("train/loss", 2.5, 3)
    w.add_scalar("train/loss", 1.5, 4)
    w.add_scalar("eval/acc", 0.75, 4)
    w.add_text("notes", "hello world", 2)
    event_file = os.path.basename(w._get_file_writer().event_writer._file_name)
    w.close()
    cs_dir = os.path.join(str(log_dir), event_file.replace("tfevents", "csevents", 1))
    os.makedirs(cs_dir)
    with open(os.path.join(cs_dir, "__metadata__"), "w") as f:
        f.write(FIXTURE["metadata_file_content"])
    ns = time.time_ns()
    for i, (name, tensor, step) in enumerate([
        ("train/w", torch.arange(4.).reshape(2, 2), 7),
        ("train/w", torch.arange(4.).reshape(2, 2) * 10, 7),
        ("train/w", torch.tensor([1, 2, 3], dtype=torch.int64), 8),
        ("deep/a/b", torch.tensor(5.0), 1),
    ]):
        at = ns + i * 10_000_000
        stamp = datetime.datetime.fromtimestamp(at / 1e9).strftime("%Y-%m-%dT%H:%M:%S.%f")
        folder = os.path.join(cs_dir, "tensors", *name.split("/"))
        os.makedirs(folder, exist_ok=True)
        torch.save({"step": step, "ns_since_epoch": at, "tensor": tensor},
                   os.path.join(folder, f"{step}.{stamp}.pt"))


def _files(log_dir):
    """Files under log_dir with host and time parts replaced as the fixture writes them."""
    out = []
    for root, _, files in os.walk(log_dir):
        for name in files:
            rel = os.path.relpath(os.path.join(root, name), log_dir).replace(os.sep, "/")
            rel = re.sub(r"^events\.out\.(tf|cs)events\.[^/]+", r"events.out.\1events.<host-time>",
                         rel)
            rel = re.sub(r"/(\d+)\.\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}\.pt$",
                         r"/\1.<YYYY-mm-ddTHH:MM:SS.ffffff>.pt", rel)
            out.append(rel)
    return sorted(out)


def _tensor_facts(t):
    return {"tensor": isinstance(t, torch.Tensor), "dtype": str(t.dtype),
            "shape": list(t.shape), "values": t.reshape(-1).tolist()}


def _scalar_event(e):
    # tensorboard's ScalarEvent: a namedtuple in some versions, a dataclass in others.
    fields = ([f.name for f in dataclasses.fields(e)] if dataclasses.is_dataclass(e)
              else list(e._fields))
    assert isinstance(e, event_accumulator.ScalarEvent)
    return {"type": type(e).__name__, "fields": fields, "step": e.step,
            "value": e.value, "wall_time_type": type(e.wall_time).__name__}


def _descriptor(d):
    assert [f.name for f in dataclasses.fields(d)] == FIXTURE["TensorDescriptor_fields"]
    return {"type": type(d).__name__, "step": d.step,
            "ns_since_epoch_type": type(d.ns_since_epoch).__name__,
            "tensor": _tensor_facts(d.tensor)}


def _text(proto):
    return [s.decode() for s in tensor_util.make_ndarray(proto).reshape(-1)]


def _result(call):
    return CALLS[call]["value"]


def _check_reader_calls(log_dir):
    """Every recorded SummaryReader call, on the files under log_dir."""
    r = SummaryReader(str(log_dir))
    assert type(r.scalar_names()).__name__ == CALLS["type(scalar_names())"]
    assert sorted(r.scalar_names()) == _result("scalar_names()")
    assert sorted(r.scalar_groups()) == _result("scalar_groups()")
    assert type(r.tensor_names()).__name__ == CALLS["type(tensor_names())"]
    assert sorted(r.tensor_names()) == _result("tensor_names()")

    loss = r.read_scalar("train/loss")
    assert type(loss).__name__ == CALLS["type(read_scalar('train/loss'))"]
    assert [_scalar_event(e) for e in loss] == _result("read_scalar('train/loss')")
    assert _scalar_event(r.read_scalar("train/loss", 4)) == _result("read_scalar('train/loss', 4)")
    with pytest.raises(KeyError) as err:
        r.read_scalar("train/loss", 99)
    assert str(err.value) == CALLS["read_scalar('train/loss', 99)"]["message"]
    assert r.read_scalar("nope") == _result("read_scalar('nope')")
    assert [_scalar_event(e) for e in r.read_scalar("train/*")] == _result("read_scalar('train/*')")
    assert [_scalar_event(e) for e in r.Scalars("eval/acc")] == _result("Scalars('eval/acc')")

    by_step = r.read_tensor("train/w")
    assert type(by_step).__name__ == CALLS["type(read_tensor('train/w'))"]
    assert {str(k): _descriptor(v) for k, v in by_step.items()} == _result("read_tensor('train/w')")
    assert _descriptor(r.read_tensor("train/w", 7)) == _result("read_tensor('train/w', 7)")
    assert [_descriptor(d) for d in r.read_tensor("train/w", 7, latest_only=False)] == _result(
        "read_tensor('train/w', 7, latest_only=False)")
    assert {str(k): [_descriptor(d) for d in v]
            for k, v in r.read_tensor("train/w", latest_only=False).items()} == _result(
        "read_tensor('train/w', latest_only=False)")
    assert r.read_tensor("train/w", 99) is _result("read_tensor('train/w', 99)") is None
    assert r.read_tensor("nope") is _result("read_tensor('nope')") is None
    assert _descriptor(r.read_tensor("deep/a/b", 1)) == _result("read_tensor('deep/a/b', 1)")

    notes = r.read_text_summary("notes")
    assert [{"type": type(e).__name__, "step": e.step, "value": _text(e.tensor_proto)}
            for e in notes] == _result("read_text_summary('notes')")
    assert r.read_text_summary("notes", 2).step == _result("read_text_summary('notes', 2).step")
    with pytest.raises(RuntimeError) as err:
        r.read_text_summary("notes", 5)
    assert str(err.value) == CALLS["read_text_summary('notes', 5)"]["message"]

    assert r.Tags() == _result("Tags()")
    assert r.reload() is _result("reload()") is None

    f = SummaryReader(str(log_dir), filter="train")
    assert sorted(f.scalar_names()) == _result("SummaryReader(D, filter='train').scalar_names()")
    assert sorted(f.tensor_names()) == _result("SummaryReader(D, filter='train').tensor_names()")
    assert [_scalar_event(e) for e in f.read_scalar("loss")] == _result(
        "SummaryReader(D, filter='train').read_scalar('loss')")
    assert _descriptor(f.read_tensor("w", 8)) == _result(
        "SummaryReader(D, filter='train').read_tensor('w', 8)")
    return r


def test_base_step_defaults_to_one(tmp_path):
    writer = SummaryWriter(log_dir=str(tmp_path))
    writer.close()
    assert writer.base_step == FIXTURE["base_step_default"] == 1
    params = inspect.signature(SummaryWriter.__init__).parameters
    assert params["base_step"].kind is inspect.Parameter.KEYWORD_ONLY
    assert list(inspect.signature(SummaryWriter.add_tensor).parameters) == [
        "self", "name", "tensor", "step"]


def test_scenario_files_are_laid_out_as_the_real_package_does(tmp_path):
    writer = _write_scenario(tmp_path)
    assert _files(tmp_path) == sorted(FIXTURE["files"])
    (event_file,) = [n for n in os.listdir(tmp_path) if "tfevents" in n]
    cs_dir = writer.cs_events_dir
    assert os.path.dirname(cs_dir) == str(tmp_path)
    assert os.path.basename(cs_dir) == event_file.replace("tfevents", "csevents", 1)
    with open(os.path.join(cs_dir, "__metadata__")) as f:
        assert f.read() == FIXTURE["metadata_file_content"]
    pts = sorted(os.listdir(os.path.join(cs_dir, "tensors", "train", "w")))
    assert len(pts) == FIXTURE["pt_files_for_train_w"]

    # The earlier of the two step-7 files; the time in the name sorts in write order.
    content = torch.load(os.path.join(cs_dir, "tensors", "train", "w", pts[0]))
    want = FIXTURE["pt_file_content"]
    assert type(content).__name__ == want["python_type"]
    assert list(content) == want["keys"]
    assert {k: type(v).__name__ for k, v in content.items()} == want["types"]
    assert content["step"] == want["step"]
    assert _tensor_facts(content["tensor"]) == want["tensor"]
    stamp = pts[0].split(".", 1)[1][:-len(".pt")]
    written = datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%f").timestamp()
    assert abs(written - content["ns_since_epoch"] / 1e9) < 1e-5


def _sorted_tags(tags):
    # The fixture writes each kind's tags sorted.
    return {k: sorted(v) if isinstance(v, list) else v for k, v in tags.items()}


def test_scenario_as_tensorboard_sees_it(tmp_path):
    _write_scenario(tmp_path)
    acc = event_accumulator.EventAccumulator(str(tmp_path)).Reload()
    assert _sorted_tags(acc.Tags()) == FIXTURE["event_accumulator_tags"]
    for tag, want in FIXTURE["event_accumulator"].items():
        if want["kind"] == "scalars":
            assert [[e.step, e.value] for e in acc.Scalars(tag)] == want["events"]
            assert want["summary_metadata"] is None
            continue
        meta = acc.SummaryMetadata(tag)
        assert {"plugin_name": meta.plugin_data.plugin_name,
                "data_class": meta.data_class} == want["summary_metadata"]
        arrays = [(e.step, tensor_util.make_ndarray(e.tensor_proto)) for e in acc.Tensors(tag)]
        assert [{"step": step, "dtype": str(a.dtype), "shape": list(a.shape),
                 "value": [s.decode() for s in a.reshape(-1)]}
                for step, a in arrays] == want["events"]

    plugin = plugin_event_accumulator.EventAccumulator(str(tmp_path))
    plugin.Reload()
    tags = _sorted_tags(plugin.Tags())
    assert {k: tags[k] for k in FIXTURE["plugin_event_accumulator_tags"]} == FIXTURE[
        "plugin_event_accumulator_tags"]
    for tag, want in FIXTURE["plugin_event_accumulator"].items():
        meta = plugin.SummaryMetadata(tag)
        assert {"plugin_name": meta.plugin_data.plugin_name,
                "data_class": meta.data_class} == want["summary_metadata"]
        got = []
        for e in plugin.Tensors(tag):
            array = tensor_util.make_ndarray(e.tensor_proto)
            value = _text(e.tensor_proto) if array.dtype == object else array.item()
            got.append({"step": e.step, "dtype": str(array.dtype), "shape": list(array.shape),
                        "value": value})
        assert got == want["events"]


def test_scenario_reader_calls_on_our_files(tmp_path):
    _write_scenario(tmp_path)
    _check_reader_calls(tmp_path)


def test_files_in_the_real_format_read_back_here(tmp_path):
    _write_real_format(tmp_path)
    assert _files(tmp_path) == sorted(FIXTURE["files"])
    _check_reader_calls(tmp_path)


def test_reader_on_a_directory_without_event_files_raises(tmp_path):
    empty = tmp_path / "empty_tb"
    empty.mkdir()
    with pytest.raises(RuntimeError) as err:
        SummaryReader(str(empty))
    want = CALLS["SummaryReader(empty dir)"]
    assert str(err.value) == want["message"].replace("<WORKDIR>", str(tmp_path))
    with pytest.raises(RuntimeError, match="No event files found"):
        SummaryReader(str(tmp_path / "missing"))


def test_text_summary_names_are_the_names_given_to_add_text(tmp_path):
    # The real package returns an empty set here (behaviour.json notes); its documentation
    # says the names of the text summaries, which is what read_text_summary takes.
    _write_scenario(tmp_path)
    with SummaryWriter(tmp_path / "more") as w:
        w.add_text("eval/report", "a", 1)
    reader = SummaryReader(str(tmp_path))
    assert reader.text_summary_names() == ["eval/report", "notes"]
    for name in reader.text_summary_names():
        assert reader.read_text_summary(name)
    assert [e.step for e in reader.read_text_summary("notes/text_summary")] == [2]
    assert reader.read_text_summary("nope") == []


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


def test_tensors_of_every_dtype_read_back_equal(tmp_path):
    tensors = _tensors()
    big = torch.randn(100, 100)
    with SummaryWriter(tmp_path) as writer:
        for step in (10, 11):
            for name, value in tensors.items():
                writer.add_tensor(name, value if value.dtype == torch.bool else value + step, step)
        # A view is saved on its own, not with the storage it is a view of.
        writer.add_tensor("view", big[3, :4], 0)
    reader = SummaryReader(tmp_path)
    assert reader.tensor_names() == set(tensors) | {"view"}
    for name, value in tensors.items():
        got = reader.read_tensor(name)
        assert list(got) == [10, 11]
        for step, d in got.items():
            want = value if value.dtype == torch.bool else value + step
            assert d.step == step and d.tensor.dtype == want.dtype and d.tensor.shape == want.shape
            assert torch.equal(d.tensor, want), name
    view = reader.read_tensor("view", 0)
    assert torch.equal(view.tensor, big[3, :4])
    assert view.tensor.untyped_storage().nbytes() == 16


def test_add_tensor_refuses_what_it_cannot_write(tmp_path):
    with SummaryWriter(tmp_path) as writer:
        with pytest.raises(TypeError, match="step"):
            writer.add_tensor("a", torch.ones(1), None)
        with pytest.raises(TypeError, match="step"):
            writer.add_tensor("a", torch.ones(1), 1.5)
        with pytest.raises(TypeError, match="tensor"):
            writer.add_tensor("a", "text", 1)
        for bad in ("", "/abs", "a/../../b", "a//b"):
            with pytest.raises(ValueError, match="name"):
                writer.add_tensor(bad, torch.ones(1), 1)
        writer.add_tensor("np", np.arange(3), 1)   # what torch.as_tensor takes is kept
    assert SummaryReader(tmp_path).read_tensor("np", 1).tensor.tolist() == [0, 1, 2]


def test_tensors_written_in_one_microsecond_are_all_kept(tmp_path):
    with SummaryWriter(tmp_path) as writer:
        for i in range(20):
            writer.add_tensor("fast", torch.tensor(i), 3)
    every = SummaryReader(tmp_path).read_tensor("fast", 3, latest_only=False)
    assert [d.tensor.item() for d in every] == list(range(20))
    assert SummaryReader(tmp_path).read_tensor("fast", 3).tensor.item() == 19


def test_multiple_log_dirs_and_nested_runs(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    with SummaryWriter(first) as writer:
        for step in range(3):
            writer.add_scalar("g/loss", float(step), step)
        writer.add_tensor("g/act", torch.arange(3), 1)
        # add_scalars writes each series into its own sub-directory (a nested run).
        writer.add_scalars("pair", {"a": 1.0, "b": 2.0}, 0)
    with SummaryWriter(second, base_step=3) as writer:
        for step in range(3, 6):
            writer.add_scalar("g/loss", float(step), step)
        writer.add_tensor("g/act", torch.arange(3) * 2, 4)
    with SummaryWriter(second / "nested") as writer:
        writer.add_scalar("nested/only", 9.0, 2)
        writer.add_tensor("nested/t", torch.ones(2), 2)

    reader = SummaryReader([str(first), str(second)])
    assert [(e.step, e.value) for e in reader.read_scalar("g/loss")] == [
        (s, float(s)) for s in range(6)]
    assert sorted(e.value for e in reader.read_scalar("pair")) == [1.0, 2.0]
    assert reader.read_scalar("nested/only", 2).value == 9.0
    acts = reader.read_tensor("g/act")
    assert list(acts) == [1, 4]
    assert torch.equal(acts[4].tensor, torch.arange(3) * 2)
    assert torch.equal(reader.read_tensor("nested/t", 2).tensor, torch.ones(2))
    assert set(reader.Tags()["scalars"]) >= {"g/loss", "nested/only", "pair"}


def test_filter_keeps_matching_groups(tmp_path):
    with SummaryWriter(tmp_path) as writer:
        for tag in ("train/loss", "training/acc", "eval/loss", "train_loss", "x/train/y"):
            writer.add_scalar(tag, 1.0, 0)
        writer.add_tensor("train/w", torch.ones(2), 0)
        writer.add_tensor("eval/w", torch.ones(2), 0)
    reader = SummaryReader(tmp_path, filter="train")
    assert reader.scalar_names() == {"train/loss", "training/acc"}
    assert reader.scalar_groups() == {"train", "training"}
    assert reader.tensor_names() == {"train/w"}
    assert reader.read_scalar("eval/loss") == []
    assert reader.read_tensor("eval/w") is None
    assert [e.value for e in reader.read_scalar("acc")] == [1.0]
    assert SummaryReader(tmp_path).scalar_groups() == {"eval", "train", "training", "x"}


def test_reload_picks_up_new_events(tmp_path):
    with SummaryWriter(tmp_path / "run") as writer:
        writer.add_scalar("a/b", 1.0, 0)
        writer.flush()
        reader = SummaryReader(tmp_path / "run")
        assert [e.value for e in reader.read_scalar("a/b")] == [1.0]
        writer.add_scalar("a/b", 2.0, 1)
        writer.add_tensor("a/t", torch.ones(1), 1)
    assert reader.tensor_names() == set()
    reader.reload()
    assert [e.value for e in reader.read_scalar("a/b")] == [1.0, 2.0]
    assert reader.tensor_names() == {"a/t"}


def test_size_guidance_is_forwarded(tmp_path):
    # TensorBoard's defaults would sample scalars down; every one is kept unless asked.
    with SummaryWriter(tmp_path) as writer:
        for step in range(1200):
            writer.add_scalar("s", float(step), step)
    assert len(SummaryReader(tmp_path).read_scalar("s")) == 1200
    sampled = SummaryReader(tmp_path, size_guidance={event_accumulator.SCALARS: 5})
    assert len(sampled.read_scalar("s")) == 5


def test_scalars_of_tensorboards_own_writers_are_read(tmp_path):
    # Newer TensorBoard writers store scalars as "scalars"-plugin tensors.
    with torch.utils.tensorboard.SummaryWriter(str(tmp_path)) as writer:
        writer.add_scalar("new/style", 0.5, 2, new_style=True)
    assert [(e.step, e.value) for e in SummaryReader(tmp_path).read_scalar("new/style")] == [
        (2, 0.5)]


def test_writer_is_torch_writer_with_base_step(tmp_path):
    writer = SummaryWriter(tmp_path / "a", base_step=5)
    try:
        assert isinstance(writer, torch.utils.tensorboard.SummaryWriter)
        assert writer.base_step == 5
        assert str(writer.get_logdir()) == str(tmp_path / "a")
        writer.base_step = np.int64(7)
        assert writer.base_step == 7 and type(writer.base_step) is int
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


def test_bad_reader_arguments(tmp_path):
    with pytest.raises(TypeError):
        SummaryReader(42)
    with pytest.raises(TypeError, match="filter"):
        SummaryReader(str(tmp_path), filter=3)


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
        utils.no_such_submodule  # pylint: disable=pointless-statement  # noqa: B018 (the read raises)


def test_a_process_other_than_the_main_one_writes_nothing(tmp_path, monkeypatch):
    import cstorch.utils.tensorboard as module
    monkeypatch.setattr(module, "_main_process", lambda: False)
    with SummaryWriter(tmp_path / "events") as writer:
        writer.add_scalar("a", 1.0, 1)
        writer.add_tensor("t", torch.ones(2), 1)
        writer.add_text("n", "x", 1)
        assert os.path.basename(writer.cs_events_dir).startswith("events.out.csevents")
        with pytest.raises(ValueError, match="name"):
            writer.add_tensor("../t", torch.ones(2), 1)
    assert not (tmp_path / "events").exists() or not any(os.scandir(tmp_path / "events"))
