"""The last of the `cerebras.pytorch` surface Model Zoo uses (issue 14): the
`cerebras.pytorch.backend` package (BackendType, get_backend_args, current_backend_impl,
use_cs, ltc_backend hooks), `cstorch.distributed`'s cluster plumbing and ordinals, and
the CSX cluster, debug and storage flags, with the calls Model Zoo makes."""
import functools
import importlib
import os
import warnings

import pytest
import torch

import cerebras.pytorch as cstorch
from cstorch.distributed import process_group


def test_backend_package_names_import_as_model_zoo_writes_them():
    from cerebras.pytorch.backend import (Backend, BackendType, current_backend_impl,
                                          get_backend_args, use_cs)
    from cerebras.pytorch.backend.ltc_backend import register_after_tensor_to_cpu
    backend_module = importlib.import_module("cstorch.backend")
    assert importlib.import_module("cerebras.pytorch.backend") is backend_module
    assert Backend is backend_module.Backend and use_cs is cstorch.use_cs
    assert callable(register_after_tensor_to_cpu) and callable(current_backend_impl)
    assert callable(cstorch.backend)   # the attribute stays the function
    assert BackendType.from_str("csx") is BackendType.CSX
    assert BackendType.from_str(BackendType.GPU) is BackendType.GPU
    assert BackendType.CSX.is_csx and not BackendType.CPU.is_csx and BackendType.GPU.is_gpu
    with pytest.raises(ValueError, match="unknown backend type 'TPU'"):
        BackendType.from_str("TPU")
    assert get_backend_args("CPU") == {"artifact_dir": None, "max_checkpoints": None,
                                       "mixed_precision": None}
    csx_args = get_backend_args(BackendType.CSX)
    assert list(csx_args)[:3] == ["artifact_dir", "compile_dir", "compile_only"]
    assert csx_args["cluster_config"] is None and csx_args["compile_only"] is False
    assert "enable_distributed" in get_backend_args("gpu")
    get_backend_args("CPU")["artifact_dir"] = "changed"   # a copy each call
    assert get_backend_args("CPU")["artifact_dir"] is None


def test_current_backend_impl_raise_exception(monkeypatch):
    from cerebras.pytorch.backend import current_backend_impl
    backend_module = importlib.import_module("cstorch.backend")
    monkeypatch.setattr(importlib.import_module("cstorch.run.current"), "_backend", None)
    assert current_backend_impl(raise_exception=False) is None
    with pytest.raises(RuntimeError, match="no backend"):
        current_backend_impl()
    # `create` is not a parameter of the reference's current_backend_impl (api_signatures)
    created = backend_module.current_or_cpu_backend()
    assert created.backend_type == "CPU" and current_backend_impl() is created
    assert current_backend_impl(False) is created


def test_backend_type_is_the_enum_and_still_a_string(tmp_path):
    from cerebras.pytorch.backend import BackendType
    b = cstorch.backend("cpu", artifact_dir=str(tmp_path))
    assert b.backend_type is BackendType.CPU and b.backend_type.name.lower() == "cpu"
    assert b.backend_type == "CPU" and f"{b.backend_type} backend" == "CPU backend"
    assert str(b.device) == "CPU" and repr(b.device) == "device(type='CPU')"
    assert cstorch.backend(BackendType.CSX, artifact_dir=str(tmp_path)).is_csx


def test_model_zoo_backend_cache_reuses_a_csx_backend(tmp_path):
    # Model Zoo's trainer keys a cache by the backend's arguments, cluster_config
    # included, and on reuse replaces the backend's cluster config.
    from cerebras.pytorch.backend import BackendType, current_backend_impl, get_backend_args

    @functools.lru_cache(maxsize=1)
    def cached(backend_type, **kwargs):
        backend_type = BackendType.from_str(backend_type)
        backend = current_backend_impl(raise_exception=False)
        if backend is not None and backend.is_csx and backend_type.is_csx:
            backend.cluster.config = kwargs.pop("cluster_config")
            assert not [n for n in get_backend_args(backend_type) if n in kwargs
                        and hasattr(backend, n) and getattr(backend, n) != kwargs[n]]
            return cstorch.backend()
        return cstorch.backend(backend_type, **kwargs)

    cstorch.backend("CPU", artifact_dir=str(tmp_path))   # no CSX backend to reuse yet
    config = cstorch.distributed.ClusterConfig(**{"num_csx": None, "mgmt_address": None})
    first = cached("CSX", artifact_dir=str(tmp_path), cluster_config=config)
    again = cached("CSX", artifact_dir=str(tmp_path),
                   cluster_config=cstorch.distributed.ClusterConfig())
    assert again is first and first.cluster.config == config
    other = cstorch.distributed.ClusterConfig(num_workers_per_csx=2)
    assert cached("CSX", artifact_dir=str(tmp_path), cluster_config=other) is first
    assert first.cluster.config is other and first.cluster.workflow_id is None
    assert first.cluster.start_workflow(lock_resources=True) is False
    with pytest.raises(ValueError, match="cannot be changed to num_csx=2"):
        first.cluster.config = cstorch.distributed.ClusterConfig(num_csx=2)
    cstorch.backend("CPU")


def test_cluster_config_takes_model_zoo_fields_and_nones():
    ClusterConfig = cstorch.distributed.ClusterConfig
    runconfig = {}   # every key unset: Model Zoo passes runconfig.get(...) -> None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config = ClusterConfig(
            mgmt_address=runconfig.get("mgmt_address"),
            mgmt_namespace=runconfig.get("mgmt_namespace"),
            credentials_path=runconfig.get("credentials_path"),
            num_csx=runconfig.get("num_csx"),
            max_wgt_servers=runconfig.get("num_wgt_servers"),
            max_act_per_csx=runconfig.get("num_act_servers"),
            num_workers_per_csx=runconfig.get("num_workers_per_csx"),
            cbcore_image=runconfig.get("cbcore_image"),
            job_labels=runconfig.get("job_labels"),
            job_time_sec=runconfig.get("job_time_sec"),
            mount_dirs=runconfig.get("mount_dirs"),
            python_paths=runconfig.get("python_paths"),
            disable_version_check=runconfig.get("disable_version_check"),
        )
    assert config == ClusterConfig() and hash(config) == hash(ClusterConfig())
    assert config.num_csx == 1 and config.num_workers_per_csx == 1
    assert config.disable_version_check is False
    assert isinstance(config, cstorch.utils.CSConfig)   # one validation, one meaning
    config.max_act_per_csx = 1
    config.job_priority = "p2"   # Model Zoo sets these after creating it
    assert config != ClusterConfig()
    with pytest.warns(UserWarning, match="ClusterConfig mount_dirs, job_priority have no effect"):
        labelled = ClusterConfig(mount_dirs=["/data"], job_priority="p1")
    with pytest.warns(UserWarning):
        assert hash(labelled) == hash(ClusterConfig(mount_dirs=["/data"], job_priority="p1"))
    with pytest.raises(ValueError, match="num_csx"):
        ClusterConfig(num_csx=0)
    with pytest.raises(ValueError, match="job_priority"):
        ClusterConfig(job_priority="urgent")


def test_cluster_config_lays_out_the_csx_mesh_and_workers(tmp_path):
    config = cstorch.distributed.ClusterConfig(num_workers_per_csx=2)
    b = cstorch.backend("CSX", artifact_dir=str(tmp_path), cluster_config=config)
    assert b.mesh.shape["systems"] == 1 and b.cluster.config is config
    specs = []

    def input_fn():
        dist = cstorch.distributed
        spec = dist.service_resolver().cluster_spec
        specs.append((spec, spec.task(), dist.get_streaming_rank()))
        return [torch.ones(2)] * 3

    loader = cstorch.utils.data.DataLoader(input_fn)
    assert len(loader.workers()) == 2
    assert [task.rank for _, task, _ in specs] == [0, 1]
    assert [rank for _, _, rank in specs] == [0, 1]
    spec, task, _ = specs[1]
    assert spec.num_tasks() == 2 and spec.num_csx == 1 and spec.num_workers_per_csx == 2
    assert (task.local_rank, task.wse_id) == (1, 0)
    with pytest.raises(RuntimeError, match="not a streaming worker"):
        cstorch.distributed.service_resolver()
    cstorch.backend("CPU")


def test_cluster_resolver_specs_as_model_zoo_builds_them():
    from cerebras.pytorch.distributed.cluster_resolver import ClusterSpec, TaskSpec
    task = TaskSpec(rank=3, local_rank=3, wse_id=0, node_name="unknown")
    spec = ClusterSpec([task], 3, 1, 4)   # (tasks, rank, num_csx, num_workers_per_csx)
    assert spec.task() is task and spec.num_tasks() == 4
    with pytest.raises(ValueError, match="no task of rank 0"):
        spec.task(0)


def test_ordinals_follow_the_process_group(monkeypatch):
    dist = cstorch.distributed
    assert (dist.get_ordinal(), dist.num_tasks(), dist.is_master_ordinal()) == (0, 1, True)
    group = process_group.ProcessGroup(rank=2, world_size=4, local_rank=0, main_process_id=1,
                                       platform="cpu")
    monkeypatch.setattr(process_group, "_group", group)
    assert (dist.get_ordinal(), dist.num_tasks(), dist.is_master_ordinal()) == (2, 4, False)
    monkeypatch.setattr(process_group, "_group", process_group.ProcessGroup(1, 4, 1, 1, "cpu"))
    assert dist.is_master_ordinal()


def test_worker_cache_limit(tmp_path):
    dist = cstorch.distributed
    assert os.path.isabs(dist.WORKER_CACHE_ROOT)
    src = tmp_path / "data"
    (src / "sub").mkdir(parents=True)
    (src / "a.bin").write_bytes(b"x" * 1000)
    (src / "sub" / "b.bin").write_bytes(b"y" * 24)
    dest = tmp_path / "cache" / "data"
    hit, size, available = dist.hit_worker_cache_limit(str(src), str(dest))
    assert size == 1024 and available > size and hit is False
    with pytest.raises(FileNotFoundError):
        dist.hit_worker_cache_limit(str(tmp_path / "missing"), str(dest))


def test_csx_cluster_debug_and_storage_flags(tmp_path):
    from cerebras.appliance.utils.debug_args import (DebugArgs, get_debug_args,
                                                     write_debug_args)
    csx = cstorch.backends.csx
    try:
        assert csx.cluster.auto_taint is False and csx.storage.s3.profile is None
        assert csx.debug.fabric_type_blacklist is None
        assert isinstance(csx.debug.debug_args, DebugArgs) and not csx.debug.debug_args
        with warnings.catch_warnings():
            warnings.simplefilter("error")   # defaults and empty settings: nothing to say
            csx.cluster.auto_taint = False
            csx.storage.s3.profile = None
            csx.debug.debug_args.MergeFrom(get_debug_args(None))
            csx.debug.debug_args = None
        with pytest.warns(UserWarning, match="csx.cluster.auto_taint has no effect"):
            csx.cluster.auto_taint = True
        with pytest.warns(UserWarning, match="csx.storage.s3.profile has no effect"):
            csx.storage.s3.profile = "default"
        with pytest.warns(UserWarning, match="fabric_type_blacklist has no effect"):
            csx.debug.fabric_type_blacklist = ["fabric-a"]
        # Model Zoo's DebugArgsPath callback: merge a file's settings into the flag.
        path = tmp_path / "debug_args.json"
        write_debug_args(DebugArgs({"debug_usr": {"threads": 4}}), path)
        with pytest.warns(UserWarning, match="debug.debug_args has no effect"):
            csx.debug.debug_args.MergeFrom(get_debug_args(path))
        assert csx.debug.debug_args.debug_usr.threads == 4
        # run_gpt_inference assigns one; a config gives dotted keys
        mine = DebugArgs({"a": 1})
        with pytest.warns(UserWarning, match="debug.debug_args has no effect"):
            csx.debug.debug_args = mine
        assert csx.debug.debug_args == mine and csx.debug.debug_args is not mine
        with pytest.warns(UserWarning, match="debug.debug_args has no effect"):
            csx.debug.debug_args = {"debug_usr.flag": True}
        assert csx.debug.debug_args.to_dict() == {"debug_usr": {"flag": True}}
        with pytest.raises(TypeError, match="auto_taint must be a bool"):
            csx.cluster.auto_taint = "yes"
        with pytest.raises(TypeError, match="profile must be None or a str"):
            csx.storage.s3.profile = 3
        with pytest.raises(TypeError, match="list of str"):
            csx.debug.fabric_type_blacklist = "fabric-a"
        with pytest.raises(TypeError, match="DebugArgs"):
            csx.debug.debug_args = 5
        with pytest.raises(AttributeError, match="storage.s3 has no flag 'region'"):
            csx.storage.s3.region = "x"
    finally:
        for group in (csx.cluster, csx.storage, csx.debug):
            group.reset()
    assert not csx.debug.debug_args and csx.storage.s3.profile is None


def test_after_tensor_to_cpu_hooks_see_step_closure_values(tmp_path):
    from cerebras.pytorch.backend.ltc_backend import register_after_tensor_to_cpu
    cstorch.backend("CPU", artifact_dir=str(tmp_path))
    model = torch.nn.Linear(3, 1)
    compiled = cstorch.compile(model)
    seen, closure_got = [], []

    @cstorch.step_closure
    def record(loss, tag):
        closure_got.append((float(loss), tag))

    @cstorch.trace
    def step(x):
        loss = compiled(x).sum()
        record(loss, "tag")
        return loss

    x = torch.ones(2, 3)
    step(x)   # no hook registered: nothing is read early
    handle = register_after_tensor_to_cpu(lambda t, name: seen.append((t.clone(), name)))
    loss = step(x)
    handle.remove()
    step(x)
    assert len(seen) == 1 and len(closure_got) == 3
    value, name = seen[0]
    assert torch.equal(value, torch.tensor(float(loss))) and name.endswith("record.0")
    with pytest.raises(TypeError, match="callable"):
        register_after_tensor_to_cpu(None)
