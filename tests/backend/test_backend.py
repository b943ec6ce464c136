"""cstorch.backend and its parameters, the csx flags, compile, and the cerebras.pytorch alias."""
import importlib
import warnings

import jax
import pytest
import torch

import cerebras.pytorch as cstorch


def test_alias_gives_this_projects_modules():
    import cstorch as ours
    from cerebras.pytorch.utils.data import DataLoader
    import cerebras.pytorch.optim
    assert cstorch is ours
    assert DataLoader is ours.utils.data.DataLoader
    assert cerebras.pytorch.optim.SGD is ours.optim.SGD
    assert ours.utils.data.__spec__.name == "cstorch.utils.data"


@pytest.mark.parametrize("kind", ["CPU", "CSX", "cpu"])
def test_backend_types(kind):
    b = cstorch.backend(kind)
    assert cstorch.backend() is b
    assert b.backend_type == kind.upper()
    assert cstorch.use_cs() == (kind.upper() == "CSX")
    assert cstorch.current_torch_device() == torch.device("cpu")


def test_every_documented_parameter_is_accepted(tmp_path):
    cstorch.backend("CSX", artifact_dir=str(tmp_path), compile_dir=str(tmp_path / "cc"),
                    compile_only=False, validate_only=False, drop_data=False, max_checkpoints=3,
                    log_initialization=True, retrace_every_iteration=False)
    cstorch.backend("CPU", artifact_dir=str(tmp_path), max_checkpoints=None, mixed_precision=None)
    assert cstorch.backend().artifact_dir == str(tmp_path)


def test_gpu_backend_without_a_gpu_says_so():
    import jax
    if any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("a GPU is present")
    with pytest.raises(RuntimeError, match="no GPU"):
        cstorch.backend("GPU", enable_distributed=False, main_process_id=0, dist_backend="nccl",
                        init_method=None, sync_batchnorm=False)


@pytest.mark.parametrize("args, kwargs, error, match", [
    (("TPU",), {}, ValueError, "unknown backend type"),
    (("CPU",), {"compile_only": True}, TypeError, "unexpected parameter.*compile_only"),
    (("CSX",), {"max_checkpoints": 0}, ValueError, "max_checkpoints"),
    (("CSX",), {"drop_data": "yes"}, TypeError, "drop_data must be a bool"),
    (("CPU", "logs", None, False, 4), {}, TypeError, "at most 3 positional"),
    (("CPU", "logs"), {"artifact_dir": "x"}, TypeError, "both by position and by keyword"),
    (("TPU", "logs"), {}, ValueError, "unknown backend type"),
    ((None,), {"artifact_dir": "x"}, TypeError, "need a backend_type"),
])
def test_bad_backend_arguments(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        cstorch.backend(*args, **kwargs)


def test_positional_parameters_follow_the_reference_order(tmp_path):
    before = jax.config.jax_compilation_cache_dir
    try:
        b = cstorch.backend("CSX", str(tmp_path / "art"), str(tmp_path / "cache"), False, True)
    finally:   # a compile_dir turns on JAX's persistent cache for the whole process
        jax.config.update("jax_compilation_cache_dir", before)
    assert b.artifact_dir == str(tmp_path / "art")
    assert b.params["compile_dir"] == str(tmp_path / "cache")
    assert b.params["compile_only"] is False and b.params["validate_only"] is True
    b = cstorch.backend("cpu", None, 3, True)
    assert b.max_checkpoints == 3 and b.params["mixed_precision"] is True


def test_current_backend_is_deprecated_and_can_return_none(monkeypatch):
    monkeypatch.setattr(importlib.import_module("cstorch.run.current"), "_backend", None)
    with pytest.warns(DeprecationWarning, match="cstorch.backend"):
        assert cstorch.current_backend(raise_exception=False) is None
    with pytest.raises(RuntimeError, match="no backend"):
        cstorch.current_backend(raise_warning=False)
    with pytest.raises(RuntimeError, match="no backend"):
        cstorch.backend()
    assert cstorch.current_torch_device() == torch.device("cpu")
    b = cstorch.backend("CPU")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cstorch.current_backend(raise_warning=False) is b


def test_csx_flags_defaults_and_validation():
    csx = cstorch.backends.csx
    assert csx.precision.optimization_level == 1
    assert csx.performance.micro_batch_size == "auto"
    assert csx.performance.transfer_processes == 5
    assert csx.debug.retrace_every_iteration is False
    assert csx.debug.lazy_initialization is True
    assert not csx.debug.debug_args and csx.debug.ini is None   # an empty DebugArgs
    assert csx.debug.compile_crd_memory_gi is None and csx.debug.wgt_memory_gi is None
    try:
        csx.precision.optimization_level = 2
        csx.performance.micro_batch_size = {"explore": {"min": 2, "max": 8}}
        csx.performance.micro_batch_size = 16
        with pytest.warns(UserWarning, match="wrk_memory_gi has no effect"):
            csx.debug.wrk_memory_gi = 8
        with warnings.catch_warnings():
            warnings.simplefilter("error")   # what happens anyway, or a flag that acts
            csx.performance.micro_batch_size = None
            csx.precision.optimization_level = 1
            csx.debug.retrace_every_iteration = True
            csx.debug.lazy_initialization = False
        for bad in (3, -1, 1.0, True):
            with pytest.raises(ValueError, match=r"\[0, 3\)"):
                csx.precision.optimization_level = bad
        for bad in (0, "fast", {"explore": {"min": 8, "max": 2}}, {"explore": {"lo": 1}}):
            with pytest.raises(ValueError, match="micro_batch_size"):
                csx.performance.micro_batch_size = bad
        with pytest.raises(ValueError, match="transfer_processes"):
            csx.performance.transfer_processes = 0
        with pytest.raises(TypeError, match="retrace_every_iteration"):
            csx.debug.retrace_every_iteration = 1
        with pytest.raises(AttributeError, match="no flag"):
            csx.debug.not_a_flag = 1
    finally:
        for group in (csx.precision, csx.performance, csx.debug):
            group.reset()


def test_compile_returns_a_pseudo_module():
    cstorch.backend("CPU")
    model = torch.nn.Linear(3, 2)
    compiled = cstorch.compile(model)
    x = torch.randn(4, 3)
    assert torch.equal(compiled(x), model(x))
    assert list(compiled.parameters()) == list(model.parameters())
    with pytest.raises(AttributeError, match="private"):
        compiled._parameters  # noqa: B018 (the read raises)
    with pytest.raises(TypeError, match="already been compiled"):
        cstorch.compile(compiled)
    with pytest.raises(TypeError, match="torch.nn.Module"):
        cstorch.compile(lambda x: x)
    with pytest.raises(RuntimeError, match="already been compiled"):
        cstorch.compile(model)


def test_compile_without_backend_creates_a_cpu_backend(monkeypatch):
    monkeypatch.setattr(importlib.import_module("cstorch.run.current"), "_backend", None)
    cstorch.compile(torch.nn.Linear(2, 2))
    assert cstorch.backend().backend_type == "CPU"
    cstorch.compile(torch.nn.Linear(2, 2), "CSX")
    assert cstorch.use_cs()


MESH_SCRIPT = r"""
import importlib
import json
import jax
import pytest
import cerebras.pytorch as cstorch

# Three runs in one process: each backend replaces the last (a user's run is refused).
importlib.import_module("cstorch.backend")._replacing_allowed = True

report = {"devices": len(jax.devices())}
b = cstorch.backend("CSX")
report["axes"] = list(b.mesh.axis_names)
report["mesh"] = dict(b.mesh.shape)
report["mesh_devices"] = int(b.mesh.devices.size)
b = cstorch.backend("CSX", cluster_config=cstorch.utils.CSConfig(num_csx=2))
report["two_systems"] = dict(b.mesh.shape)
with pytest.raises(ValueError, match="cannot be split into 3 systems") as info:
    cstorch.backend("CSX", cluster_config=cstorch.utils.CSConfig(num_csx=3))
report["three_systems_error"] = str(info.value)
print(json.dumps(report))
"""


def test_csx_backend_lays_an_emulated_mesh_over_eight_devices():
    # Mesh shapes only mean something over several devices; one device gives 1x1x1 for
    # any layout. XLA_FLAGS must be set before JAX starts, hence the subprocess.
    import json
    import os
    import subprocess
    import sys
    from tests.conftest import ROOT
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
           "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}
    proc = subprocess.run([sys.executable, "-c", MESH_SCRIPT], env=env, capture_output=True,
                          text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["devices"] == 8
    assert report["axes"] == ["systems", "rows", "cols"]
    assert report["mesh"] == {"systems": 1, "rows": 2, "cols": 4}
    assert report["mesh_devices"] == 8
    assert report["two_systems"] == {"systems": 2, "rows": 2, "cols": 2}
    assert "8 devices" in report["three_systems_error"]


def test_csconfig_validates():
    with pytest.warns(UserWarning, match="CSConfig job_labels has no effect here"):
        config = cstorch.utils.CSConfig(num_csx=1, job_labels=["team=ml"])
    assert config.max_wgt_servers == 24 and config.transfer_processes == 5
    with pytest.raises(ValueError, match="num_csx"):
        cstorch.utils.CSConfig(num_csx=0)
    with pytest.raises(ValueError, match="precision_opt_level"):
        cstorch.utils.CSConfig(precision_opt_level=3)
    with pytest.raises(ValueError, match="key=value"):
        cstorch.utils.CSConfig(job_labels=["oops"])


def test_csconfig_fields_and_defaults_are_the_references():
    import dataclasses
    defaults = {f.name: f.default for f in dataclasses.fields(cstorch.utils.CSConfig)}
    assert defaults == {
        "mgmt_address": None, "credentials_path": None, "num_csx": 1, "max_wgt_servers": 24,
        "max_act_per_csx": 1, "num_workers_per_csx": 1, "transfer_processes": 5,
        "job_time_sec": None, "mount_dirs": None, "python_paths": None, "job_labels": None,
        "debug_args": None, "precision_opt_level": 1}
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # the emulated fields shape the run: no warning
        cstorch.utils.CSConfig(num_csx=2, num_workers_per_csx=3)
    with pytest.warns(UserWarning, match="mgmt_address, max_wgt_servers have no effect"):
        cstorch.utils.CSConfig(mgmt_address="10.0.0.1:9000", max_wgt_servers=4)


def test_numpy_utilities_share_memory_and_keep_bfloat16():
    import ml_dtypes
    import numpy as np
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = cstorch.from_numpy(a)
    t[0, 0] = 42.0
    assert a[0, 0] == 42.0                        # zero-copy
    assert np.shares_memory(cstorch.to_numpy(t), a)
    b = np.array([1.5, -2.0, 3.25], dtype=ml_dtypes.bfloat16)
    tb = cstorch.from_numpy(b)
    assert tb.dtype == torch.bfloat16 and tb.tolist() == [1.5, -2.0, 3.25]
    tb[1] = 8.0
    assert float(b[1]) == 8.0
    back = cstorch.to_numpy(tb)
    assert back.dtype == ml_dtypes.bfloat16 and np.shares_memory(back, b)
    frozen = np.ones(3, np.float32)
    frozen.flags.writeable = False
    assert torch.equal(cstorch.from_numpy(frozen), torch.ones(3))   # copied, no warning


def test_numpy_utilities_round_trip():
    import numpy as np
    for t in (torch.arange(6.0).reshape(2, 3), torch.tensor([1.5, -2.0]).to(torch.bfloat16),
              torch.tensor([True, False])):
        back = cstorch.from_numpy(cstorch.to_numpy(t))
        assert back.dtype == t.dtype and torch.equal(back, t)
    assert isinstance(cstorch.to_numpy(torch.ones(2)), np.ndarray)


def test_a_second_backend_is_refused_and_the_first_keeps_training(monkeypatch):
    # Issue 32: a second cstorch.backend(...) replaced the first, and a model compiled on
    # the first then failed with "cannot find Parameter". The reference refuses it
    # (BackendMeta, the metaclass of Backend, admits one backend per process).
    backend_module = importlib.import_module("cstorch.backend")
    monkeypatch.setattr(importlib.import_module("cstorch.run.current"), "_backend", None)
    monkeypatch.setattr(backend_module, "_replacing_allowed", False)
    first = cstorch.backend("CPU")
    torch.manual_seed(3)
    model = torch.nn.Linear(4, 2)
    reference = torch.nn.Linear(4, 2)
    reference.load_state_dict(model.state_dict())
    compiled = cstorch.compile(model)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
    for attempt in (lambda: cstorch.backend("CSX"), lambda: cstorch.backend("CPU"),
                    lambda: backend_module.Backend("CPU"),
                    lambda: cstorch.compile(torch.nn.Linear(2, 2), "CSX")):
        with pytest.raises(RuntimeError, match="cannot instantiate a second backend: a CPU "
                                               "backend already exists"):
            attempt()
    assert cstorch.backend() is first
    assert cstorch.compile(torch.nn.Linear(2, 2), "CPU").backend is first   # the same type
    assert type(backend_module.Backend) is backend_module.BackendMeta

    @cstorch.trace
    def step(x, y):
        loss = torch.nn.functional.mse_loss(compiled(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    x, y = torch.randn(8, 4), torch.randn(8, 2)
    loss = step(x, y)
    torch_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    expected = torch.nn.functional.mse_loss(reference(x), y)
    expected.backward()
    torch_opt.step()
    assert float(loss) == pytest.approx(float(expected.detach()), rel=1e-5)
    torch.testing.assert_close(model.weight.detach().clone(), reference.weight.detach(),
                               rtol=1e-4, atol=1e-6)
