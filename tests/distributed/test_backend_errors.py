"""What a GPU backend with enable_distributed refuses, before anything is joined."""
import warnings

import jax
import pytest

import cerebras.pytorch as cstorch

LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture
def no_launch(monkeypatch):
    for name in LAUNCH_VARS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def launched(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29999")


def test_needs_a_torchrun_launch(no_launch):
    with pytest.raises(RuntimeError, match="launched by torchrun.*RANK, WORLD_SIZE"):
        cstorch.backend("GPU", enable_distributed=True, dist_backend="gloo")


@pytest.mark.parametrize("name", ["mpi", "ucc", "NCCL2"])
def test_unknown_dist_backend(no_launch, name):
    with pytest.raises(ValueError, match=f"dist_backend '{name}' is not supported.*gloo"):
        cstorch.backend("GPU", enable_distributed=True, dist_backend=name)


def test_main_process_id_must_be_a_rank(launched):
    with pytest.raises(ValueError, match="main_process_id 2 is not a rank.*0 to 1"):
        cstorch.backend("GPU", enable_distributed=True, dist_backend="gloo", main_process_id=2)


def test_jax_must_not_have_started(launched):
    jax.devices()   # this process has used JAX already
    with pytest.raises(RuntimeError, match="JAX was already used.*before anything runs"):
        cstorch.backend("GPU", enable_distributed=True, dist_backend="gloo")


@pytest.mark.parametrize("params", [{"sync_batchnorm": True}, {"dist_backend": "gloo"},
                                    {"init_method": "env://"}, {"main_process_id": 1}])
def test_distributed_settings_warn_without_enable_distributed(params):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            cstorch.backend("GPU", **params)
        except RuntimeError:   # no GPU here: the warning comes first
            pass
    assert any("no effect without enable_distributed=True" in str(w.message) for w in caught)
    assert any(next(iter(params)) in str(w.message) for w in caught)
