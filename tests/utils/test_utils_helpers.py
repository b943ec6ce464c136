"""cerebras.pytorch.utils names beside the data pipeline: utils.utils helpers, the
step_closures helpers, DataLoader.is_restartable, DistributedSampler.set_state."""
import os

import pytest
import torch

import cerebras.pytorch as cstorch
from cerebras.pytorch.utils import step_closures
from cerebras.pytorch.utils.utils import convert_glob_to_regex, get_dir_size, override_env_vars


def test_get_dir_size_sums_the_files_below(tmp_path):
    (tmp_path / "a").write_bytes(b"x" * 10)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b").write_bytes(b"y" * 32)
    assert get_dir_size(tmp_path) == 42
    with pytest.raises(NotADirectoryError):
        get_dir_size(tmp_path / "a")


def test_override_env_vars_restores_the_environment(monkeypatch):
    monkeypatch.setenv("CSTORCH_TEST_A", "old")
    monkeypatch.delenv("CSTORCH_TEST_B", raising=False)
    with override_env_vars(CSTORCH_TEST_A="new", CSTORCH_TEST_B=3):
        assert os.environ["CSTORCH_TEST_A"] == "new" and os.environ["CSTORCH_TEST_B"] == "3"
    assert os.environ["CSTORCH_TEST_A"] == "old" and "CSTORCH_TEST_B" not in os.environ


def test_convert_glob_to_regex_takes_f():
    assert convert_glob_to_regex(f="*.weight").match("fc.weight")


def test_step_closure_context_and_repeat():
    seen = []

    @cstorch.step_closure
    def inner():
        seen.append(list(step_closures.StepClosureContext.step_closure_stack))

    inner()   # no executor running: runs now, inside the context
    assert seen == [["inner"]] and step_closures.StepClosureContext.step_closure_stack == []
    with step_closures.RepeatStepClosure():
        assert step_closures.RepeatStepClosure.active
    assert not step_closures.RepeatStepClosure.active
    backend = cstorch.backend("CPU")
    assert step_closures.current_backend_impl() is backend


def test_is_restartable_is_a_property_and_set_state_takes_start_index():
    class Restartable(torch.utils.data.DataLoader):
        def state_dict(self):
            return {}

        def load_state_dict(self, state_dict, strict=True):
            pass

        def aggregate_state_dict(self, worker_states):
            return worker_states[0]

        def deaggregate_state_dict(self, aggregated_state_dict, strict=True):
            return aggregated_state_dict

    plain = cstorch.utils.DataLoader(lambda: torch.utils.data.DataLoader([1, 2]))
    restartable = cstorch.utils.DataLoader(lambda: Restartable([1, 2]))
    assert plain.is_restartable is False and restartable.is_restartable is True
    sampler = cstorch.utils.data.DistributedSampler(list(range(8)), shuffle=False, batch_size=2)
    sampler.set_state(start_index=4)
    assert [list(b) for b in sampler] == [[4, 5], [6, 7]]
    with pytest.raises(ValueError, match="start_index"):
        sampler.set_state(-1)
    assert cstorch.utils.SyntheticDataset is cstorch.utils.data.SyntheticDataset
