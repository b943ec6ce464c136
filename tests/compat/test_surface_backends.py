"""`cstorch.backends` as the reference has it: the callable `backends` namespace, its flag
descriptors, and the `Backend` members Model Zoo reads."""
import pytest
import torch

import cerebras.pytorch as cstorch
from cerebras.pytorch.backends import (DeviceConfig, MicroBatchSize, POL,
                                       RetraceEveryIteration, backends)


def test_the_namespace_is_the_module_and_sets_flags_for_a_block():
    csx = cstorch.backends.csx
    assert backends is cstorch.backends and callable(backends) and backends.csx is csx
    assert repr(backends).startswith(
        "backends(csx=(precision=(optimization_level=1), performance=(micro_batch_size='auto'")
    with backends(csx={"precision": {"optimization_level": 0},
                       "performance": {"micro_batch_size": 4}}) as ns:
        assert ns is backends
        assert csx.precision.optimization_level == 0 and csx.performance.micro_batch_size == 4
    assert csx.precision.optimization_level == 1 and csx.performance.micro_batch_size == "auto"
    with pytest.raises(ValueError, match=r"\[0, 3\)"):
        with backends(csx={"precision": {"optimization_level": 5}}):
            pass
    with pytest.raises(AttributeError, match="no flag 'nope'"):
        with backends(csx={"debug": {"nope": 1}}):
            pass
    with pytest.raises(AttributeError, match="only csx"):
        backends(gpu={})
    assert csx.precision.optimization_level == 1


def test_flag_descriptors_check_what_is_set():
    class Flags:
        level = POL(default=1)
        mbs = MicroBatchSize(default="auto")
        retrace = RetraceEveryIteration(default=False)
        config = DeviceConfig(default_factory=dict)

    a, b = Flags(), Flags()
    assert (a.level, a.mbs, a.retrace, a.config) == (1, "auto", False, {})
    a.level, a.mbs, a.retrace = 2, 8, True
    a.config["x"] = 1
    with pytest.warns(UserWarning, match="config has no effect here"):
        b.config = {"fabric": "x"}
    b.config = None
    assert (a.level, a.mbs, a.retrace, b.level, b.config) == (2, 8, True, 1, None)
    Flags.mbs.set_attr(b, {"explore": {"min": 2, "max": 4}})
    assert b.mbs == {"explore": {"min": 2, "max": 4}}
    for attr, bad, error in [("level", 3, ValueError), ("mbs", 0, ValueError),
                             ("retrace", 1, TypeError), ("config", [1], TypeError)]:
        with pytest.raises(error):
            setattr(a, attr, bad)
    with pytest.raises(ValueError, match="not both"):
        POL(default=1, default_factory=int)


def test_backend_members(tmp_path):
    b = cstorch.backend("CSX", artifact_dir=str(tmp_path / "a"))
    assert b.artifact_dir == str(tmp_path / "a") and b.cluster_config is None
    b.artifact_dir = tmp_path / "b"                # Model Zoo's trainer moves it
    assert b.artifact_dir == str(tmp_path / "b")
    assert b.cluster.config is None and str(b.device) == "CSX"
    config = cstorch.distributed.ClusterConfig(num_csx=1)
    b.cluster.config = config
    assert b.cluster_config is config
    torch.manual_seed(2)
    model = torch.nn.Linear(3, 2)
    weight = model.weight.detach().clone()
    cstorch.compile(model, b)
    out = b.to_cpu({"w": model.weight, "n": 3})
    assert type(out["w"]) is torch.Tensor and torch.equal(out["w"], weight) and out["n"] == 3
    from cerebras.pytorch.backend import BackendType
    assert BackendType.from_str(backend_type="csx") is BackendType.CSX
