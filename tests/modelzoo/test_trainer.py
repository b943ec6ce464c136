"""Model Zoo's `Trainer` run by its own CLI, `cszoo fit PARAMS.yaml --model_dir DIR`
(`python -m cerebras.modelzoo.cli.main`: validate the params, build the Trainer, `fit`),
fitting a tiny GPT-2 on the CPU backend with its default callbacks (CheckLoss, ComputeNorm,
LogOptimizerParamGroup, profilers, ...) and loggers (progress, TensorBoard), checkpointing
every 2 of 4 steps, then resuming from the first checkpoint (`--checkpoint_path`).

The data is what `GptHDF5MapDataProcessor` reads: HDF5 files of preprocessed samples, each
`data` row holding `input_ids`, the loss mask and `labels`.

Nothing of Model Zoo or of the libraries is patched: the install has the `modelzoo` extra
(pydantic < 2.10, which Model Zoo's config classes need; torchvision, lm_eval, wandb and
datasets, which its trainer imports), and cstorch lets `dataclasses.replace` rebuild torch's
`TreeSpec` as Model Zoo's config dump does (`cstorch.torch_compat`) and torchvision import
beside the CPU-only torch (`cstorch_torchvision`). One module is stood in
for: BigCode's evaluation harness (`bigcode_eval`), which the trainer's extensions import
and which is not on PyPI (Model Zoo installs it from its git repository; this machine
reaches only PyPI): an inert module, only while it is not installed.
"""
import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import logging
import math
import os
import re
import runpy
import sys
import types
import warnings
from typing import Optional

import h5py
import numpy as np
import pytest
import torch
import yaml

import cerebras.pytorch as cstorch
from cstorch.tracing.program_cache import ProgramCache
from tests.modelzoo import common
from tests.modelzoo.common import SEQ, VOCAB

PARAMS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "params_gpt2_tiny.yaml")
STEPS, CKPT_STEPS, BATCH = 4, 2, 4
RTOL = 1e-5


def _check_install():
    import pydantic
    if tuple(int(x) for x in pydantic.VERSION.split(".")[:2]) >= (2, 10):
        pytest.fail(f"Model Zoo's trainer needs the `modelzoo` extra (pydantic < 2.10, here "
                    f"{pydantic.VERSION}): pip install -e .[test,modelzoo], as "
                    f"scripts/install.sh test does")


class _Inert:
    """Whatever a module-level import or decorator of the stood-in module asks for."""

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        return _Inert()

    def __getattr__(self, name):
        return _Inert()


class _InertModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Inert


class _BigCodeStandIn(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] == "bigcode_eval":
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return _InertModule(spec.name)

    def exec_module(self, module):
        module.__path__ = []


@contextlib.contextmanager
def _modelzoo_runtime():
    """Model Zoo's modules importable: Model Zoo's source on sys.path, and the stand-in for
    BigCode's harness where it is not installed (see the module docstring)."""
    _check_install()
    if common.MODELZOO_SRC not in sys.path:
        sys.path.insert(0, common.MODELZOO_SRC)
    stand_in = [_BigCodeStandIn()] if importlib.util.find_spec("bigcode_eval") is None else []
    sys.meta_path[:0] = stand_in
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning, module="cerebras.modelzoo")
            warnings.filterwarnings("ignore", category=DeprecationWarning,
                                    module="cerebras.modelzoo")
            yield
    finally:
        for finder in stand_in:
            sys.meta_path.remove(finder)
            for name in [n for n in sys.modules if n.split(".")[0] == "bigcode_eval"]:
                del sys.modules[name]


def _params(tmp_path, data_dir, max_steps=STEPS):
    """The params YAML with the data directory and step count of this run, written to
    `tmp_path`: its path."""
    with open(PARAMS) as f:
        params = yaml.safe_load(f)
    params["trainer"]["init"]["loop"]["max_steps"] = max_steps
    params["trainer"]["fit"]["train_dataloader"]["data_dir"] = str(data_dir)
    path = tmp_path / "params.yaml"
    with open(path, "w") as f:
        yaml.safe_dump(params, f)
    return path


def _write_samples(data_dir, samples=8 * BATCH, seed=0):
    """`samples` rows of GptHDF5MapDataProcessor's 'sample' format: (N, 3, SEQ) int32, each
    row [input_ids, attention_mask (the loss mask), labels (the inputs shifted by one)]."""
    data_dir.mkdir()
    tokens = np.random.default_rng(seed).integers(0, VOCAB, (samples, SEQ + 1), dtype=np.int32)
    data = np.stack([tokens[:, :-1], np.ones((samples, SEQ), np.int32), tokens[:, 1:]], axis=1)
    with h5py.File(data_dir / "data-000000.h5", "w") as f:
        f.create_dataset("data", data=data)


@contextlib.contextmanager
def _restoring_logging():
    """The Trainer configures logging for its process (root handlers to stdout and its
    run.log, INFO level, an excepthook): put back what the test process had."""
    root = logging.getLogger()
    level, handlers, excepthook = root.level, list(root.handlers), sys.excepthook
    try:
        yield
    finally:
        for handler in root.handlers:
            if handler not in handlers:
                handler.close()
        root.handlers[:] = handlers
        root.setLevel(level)
        sys.excepthook = excepthook


def _cszoo_fit(*args):
    """`cszoo fit ARGS` in this process: Model Zoo's CLI module run as `python -m` runs it."""
    with _modelzoo_runtime(), _restoring_logging(), \
            pytest.MonkeyPatch.context() as monkeypatch:
        from cerebras.modelzoo.trainer.utils import cached_cstorch_backend
        # Each fit on a new backend, as a new `cszoo fit` process has (Model Zoo keeps the
        # backend of the last trainer for the next one in the same process).
        cached_cstorch_backend.cache_clear()
        monkeypatch.setattr(sys, "argv", ["cszoo", "fit", *map(str, args)])
        runpy.run_module("cerebras.modelzoo.cli.main", run_name="__main__", alter_sys=False)


def _scalars(model_dir, name):
    reader = cstorch.utils.tensorboard.SummaryReader(str(model_dir / "events"))
    return {e.step: e.value for e in reader.read_scalar(name)}


def _logged_losses(model_dir):
    """The losses the ProgressLogger wrote to the run's log, by step."""
    text = (model_dir / "latest_run.log").read_text()
    return {int(step): float(loss)
            for step, loss in re.findall(r"\| Train Device=CPU, Step=(\d+), Loss=([^,]+),", text)}


def _checkpoints(model_dir):
    """The checkpoints the Trainer lists in its index, in the order it wrote them."""
    with open(model_dir / "checkpoints_index.yaml") as f:
        return yaml.safe_load(f)


def _assert_states_close(actual, expected):
    """Two state dicts (of tensors) with the same keys, equal within RTOL of each tensor's
    scale."""
    assert sorted(actual) == sorted(expected)
    for key, e in expected.items():
        a, e = common.to_numpy(actual[key]), common.to_numpy(e)
        np.testing.assert_allclose(a, e, rtol=RTOL, atol=RTOL * np.max(np.abs(e)), err_msg=key)


@pytest.fixture(scope="module")
def first_fit(tmp_path_factory):
    """The params YAML fitted for STEPS steps from scratch: (data dir, model dir, the
    program caches of the traced steps the fit ran)."""
    tmp_path = tmp_path_factory.mktemp("trainer")
    data_dir, model_dir = tmp_path / "data", tmp_path / "model_dir"
    _write_samples(data_dir)
    caches = []
    made = ProgramCache.__init__

    def recording(self, *args, **kwargs):
        made(self, *args, **kwargs)
        caches.append(self)
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.chdir(tmp_path)
        monkeypatch.setattr(ProgramCache, "__init__", recording)
        _cszoo_fit(_params(tmp_path, data_dir), "--model_dir", model_dir)
    return data_dir, model_dir, caches


def _load_checkpoints(model_dir):
    """{step: state} of the checkpoints the Trainer lists, checked to be where it says, in
    cstorch's HDF5 format, each with the model, optimizer, scheduler and dataloader state."""
    expected = [str(model_dir / f"checkpoint_{s}.mdl")
                for s in range(CKPT_STEPS, STEPS + 1, CKPT_STEPS)]
    assert _checkpoints(model_dir) == expected
    reference = common.build("gpt2", loss_scaling="num_tokens").state_dict()
    states = {}
    for path in expected:
        assert h5py.is_hdf5(path)
        state = cstorch.load(path)
        step = int(path.rsplit("_", 1)[1].split(".")[0])
        assert state["global_step"] == step
        model_state = state["model"]
        assert sorted(model_state) == sorted(reference)   # the GPT-2 the YAML describes
        for key, value in model_state.items():
            assert isinstance(value, torch.Tensor) and value.shape == reference[key].shape, key
        opt = state["optimizer"]
        assert {"state", "param_groups"} <= set(opt)
        assert len(opt["param_groups"]) == 2   # Model Zoo's decay / no-decay groups
        assert {"exp_avg", "exp_avg_sq"} <= {k for s in opt["state"].values() for k in s}
        assert state["schedulers"][0]["last_epoch"] == step
        assert state["dataloader"]["samples_streamed"] == step * BATCH
        states[step] = state
    return states


def test_trainer_fits_tiny_gpt2_from_params_yaml(first_fit):
    _, model_dir, _ = first_fit

    # Losses: finite, one per step, in TensorBoard and in the progress log alike.
    losses = _scalars(model_dir, "loss")
    assert sorted(losses) == list(range(1, STEPS + 1))
    assert all(math.isfinite(v) for v in losses.values())
    assert abs(losses[1] - math.log(VOCAB)) < 0.5   # a fresh model's loss is near ln(V)
    logged = _logged_losses(model_dir)
    assert sorted(logged) == sorted(losses)
    for step, loss in logged.items():
        assert loss == pytest.approx(losses[step], rel=1e-4)
    # What the default callbacks compute inside the traced step comes out too, at the step
    # it belongs to: the trainer advances its global step at the end of the batch, and the
    # step closures that log these run after it, as in the real package.
    for name in ("model_wise_grad_norm", "model_wise_params_norm", "lr/0"):
        values = _scalars(model_dir, name)
        assert sorted(values) == list(range(1, STEPS + 1)), name
        assert all(math.isfinite(v) for v in values.values()), name
    # The learning rate logged at a step is the one that step used (LinearLR from 1e-3 to
    # 1e-4 over 4 steps: step s uses 1e-3 - 9e-4 * (s - 1) / 4), not the next step's,
    # which the scheduler sets later in the same traced step.
    lr = _scalars(model_dir, "lr/0")
    for step in range(1, STEPS + 1):
        assert lr[step] == pytest.approx(1e-3 - 9e-4 * (step - 1) / 4, rel=1e-5), (step, lr)

    states = _load_checkpoints(model_dir)
    moved = [k for k, v in states[STEPS]["model"].items()
             if not torch.equal(v, states[CKPT_STEPS]["model"][k])]
    assert moved, "the parameters did not change between the checkpoints"


def test_trainer_resumes_from_its_checkpoint(first_fit, tmp_path, monkeypatch):
    """Resuming from the step-2 checkpoint (model, optimizer, scheduler, global step and
    dataloader position) continues the same run: the same losses and final state."""
    data_dir, model_dir, _ = first_fit
    losses = _scalars(model_dir, "loss")
    states = _load_checkpoints(model_dir)
    monkeypatch.chdir(tmp_path)
    resumed_dir = tmp_path / "resumed"

    _cszoo_fit(_params(tmp_path, data_dir), "--model_dir", resumed_dir,
               "--checkpoint_path", model_dir / f"checkpoint_{CKPT_STEPS}.mdl")

    resumed_losses = _scalars(resumed_dir, "loss")
    assert sorted(resumed_losses) == list(range(CKPT_STEPS + 1, STEPS + 1))
    np.testing.assert_allclose([resumed_losses[s] for s in sorted(resumed_losses)],
                               [losses[s] for s in sorted(resumed_losses)], rtol=RTOL)
    assert _checkpoints(resumed_dir) == [str(resumed_dir / f"checkpoint_{STEPS}.mdl")]
    final = cstorch.load(str(resumed_dir / f"checkpoint_{STEPS}.mdl"))
    expected = states[STEPS]
    assert final["global_step"] == STEPS
    assert final["dataloader"]["samples_streamed"] == STEPS * BATCH
    assert final["schedulers"] == expected["schedulers"]
    _assert_states_close(final["model"], expected["model"])
    assert sorted(final["optimizer"]["state"]) == sorted(expected["optimizer"]["state"])
    for key, slots in expected["optimizer"]["state"].items():
        _assert_states_close(final["optimizer"]["state"][key], slots)
    assert final["optimizer"]["param_groups"] == expected["optimizer"]["param_groups"]


def test_the_training_step_is_compiled_once(first_fit):
    """The trainer's global step, reachable from the step through Model Zoo's summaries
    global, changes at every step but only the step closures read it: one capture finds
    that it leaves the program as it was and takes the compiled step; no capture after
    that (before: a capture and a compile at every step). The steps that ran the program
    taken again compute what eager PyTorch does: step 3's loss is the loss of the
    step-2 checkpoint's model on step 3's batch."""
    data_dir, model_dir, caches = first_fit
    assert [(c.name, c.captures, c.compiles) for c in caches] == [("training_step", 2, 1)]

    model = common.build("gpt2", loss_scaling="num_tokens")
    model.load_state_dict(cstorch.load(str(model_dir / f"checkpoint_{CKPT_STEPS}.mdl"))["model"])
    with h5py.File(data_dir / "data-000000.h5") as f:
        rows = torch.from_numpy(f["data"][CKPT_STEPS * BATCH:(CKPT_STEPS + 1) * BATCH])
    batch = {k: rows[:, i].contiguous()
             for i, k in enumerate(("input_ids", "attention_mask", "labels"))}
    with torch.no_grad():
        expected = float(model(batch))
    assert _scalars(model_dir, "loss")[CKPT_STEPS + 1] == pytest.approx(expected, rel=RTOL)


def test_what_the_trainer_reads_from_cstorch():
    """The cstorch surface the Trainer uses beyond a plain training loop, checked directly:
    its checkpoint `Schedule.Range` arithmetic, DataLoader ids, `@cstorch.trace` on a method, the compiled
    model's `device`, `backend.is_tracing` and `backend._impl`, and the optimizer
    annotations its config classes are built from."""
    Range = cstorch.utils.data.Schedule.Range
    r = Range(start=1, end=8, step=3, include_last=True)    # 1, 4, 7: 7 is the last anyway
    assert list(r) == [1, 4, 7] and len(r) == 3 and r.range() == range(1, 8, 3)
    r = Range(start=1, end=9, step=3, include_last=True)    # 1, 4, 7 and the last step, 8
    assert list(r) == [1, 4, 7, 8] and len(r) == 4 and len(r.range()) == 3
    assert [r.next_immediate_step(i) for i in (0, 1, 2, 4, 5, 8)] == [1, 1, 4, 4, 7, 8]
    with pytest.raises(TypeError, match="missing 3 required positional arguments"):
        Range(start=0)

    # Each DataLoader has its own `id`, which the trainer keys validation dataloaders by.
    loaders = [cstorch.utils.data.DataLoader(lambda: []) for _ in range(2)]
    assert isinstance(loaders[0].id, int) and loaders[0].id != loaders[1].id
    assert loaders[0].id == loaders[0].id

    backend = cstorch.backend("CPU")
    assert backend._impl is backend
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    compiled = cstorch.compile(model, backend)
    assert model.device == backend.torch_device

    class Loop:
        def __init__(self):
            self.tracing = []

        @cstorch.trace
        def step(self, x):
            self.tracing.append(backend.is_tracing)   # Python runs once: at capture
            return compiled(x).sum()

        same_step = step

    a, b = Loop(), Loop()
    assert a.step is a.step and a.step is not b.step and Loop.step is Loop.__dict__["step"]
    assert a.same_step is a.step
    x = torch.ones(4, 3)
    with torch.no_grad():
        expected = float(model(x).sum())
    assert float(a.step(x)) == pytest.approx(expected)
    assert float(a.step(x)) == pytest.approx(expected)
    assert float(b.step(x)) == pytest.approx(expected)
    assert a.tracing == [True] and b.tracing == [True] and not backend.is_tracing
    assert a.step.captures == 1 and a.step.name == "step"

    from cerebras.appliance.utils.classes import retrieve_all_subclasses
    from cerebras.pytorch.optim.optimizer import ParamsT
    annotated = 0
    for cls in retrieve_all_subclasses(cstorch.optim.Optimizer):
        params = inspect.signature(cls.__init__).parameters
        if "lr" in params:
            assert params["params"].annotation is ParamsT, cls
            assert params["lr"].annotation in (float, Optional[float]), cls  # noqa: UP045 (compares with the annotation Model Zoo writes)
            annotated += 1
    assert annotated >= 14
