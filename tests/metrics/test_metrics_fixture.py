"""`../shared/fixtures/metrics.json` (what the real package's metrics and amp dtype helpers
returned on fixed inputs) reproduced by every metric there, eagerly and accumulated on the
device inside traced eval steps, `reset()` included; and its amp facts."""
import json
import math
import os

import pytest
import torch

import cerebras.pytorch as cstorch
from tests.conftest import SHARED

with open(os.path.join(SHARED, "fixtures", "metrics.json")) as f:
    FIXTURE = json.load(f)
CASES = FIXTURE["metrics"]
RTOL = 1e-6


def case_id(case):
    return f"{case['metric']}-{case['init']['name']}"


def arguments(update):
    """An update's keyword arguments: tensors of the recorded dtypes, numbers as given."""
    kwargs = {}
    for key, value in update["args"].items():
        dtype = update["arg_dtypes"].get(key)
        kwargs[key] = value if dtype is None else \
            torch.tensor(value, dtype=getattr(torch, dtype.split(".")[1]))
    return kwargs


def assert_value(got, expected):
    got = float(got)
    if math.isnan(expected):
        assert math.isnan(got), got
    elif expected == 0:
        assert got == 0, got
    else:
        assert abs(got - expected) <= RTOL * abs(expected), (got, expected)


def build(case):
    return getattr(cstorch.metrics, case["metric"])(**case["init"])


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_eager(case):
    metric = build(case)
    for n, update in enumerate(case["updates"], 1):
        metric(**arguments(update))
        assert_value(metric.compute(), update["compute"])
        assert_value(float(metric), update["float"])
        assert metric.num_updates == n
    metric.reset()
    assert_value(metric.compute(), case["after_reset"])
    assert metric.num_updates == 0


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_traced(case, capfd):
    backend = cstorch.backend("CPU")
    metric = build(case)

    @cstorch.trace
    @torch.no_grad()
    def eval_step(batch):
        metric(**batch)

    for n, update in enumerate(case["updates"], 1):
        eval_step(arguments(update))
        # The accumulators are run state on the device, under the metric's own name.
        assert type(metric.update_count).__name__ == "DeviceTensor"
        assert_value(metric.compute(), update["compute"])
        assert_value(float(metric), update["float"])
        assert metric.num_updates == n
    prefix = "metrics." + "".join(c if c.isalnum() or c == "_" else "_"
                                  for c in case["init"]["name"])
    assert f"{prefix}.update_count" in backend.state.names
    assert "not passed to cstorch.compile" not in capfd.readouterr().err

    metric.reset()  # writes through to the device state
    assert_value(metric.compute(), case["after_reset"])
    assert metric.num_updates == 0
    first = case["updates"][0]
    eval_step(arguments(first))  # the first update's program again, from zero
    assert_value(metric.compute(), first["compute"])
    assert metric.num_updates == 1


def test_amp_facts():
    amp, facts = cstorch.amp, FIXTURE["amp"]
    saved = amp.get_half_dtype_str(), amp.mixed_precision()
    try:
        amp.set_half_dtype("float16")       # switches mixed precision on, as the real one
        amp.enable_mixed_precision(False)
        assert str(amp.get_half_dtype()) == facts["default_half_dtype"]
        assert amp.get_half_dtype_str() == facts["default_half_dtype_str"]
        assert str(amp.get_floating_point_dtype()) == facts["floating_point_dtype_default"]
        assert amp.get_floating_point_dtype_str() == facts["floating_point_dtype_str_default"]
        assert amp.mixed_precision() is facts["mixed_precision_default"]

        after = facts["after_enable_mixed_precision"]
        amp.enable_mixed_precision()
        assert amp.mixed_precision() is after["mixed_precision"]
        assert str(amp.get_floating_point_dtype()) == after["floating_point_dtype"]
        assert amp.get_floating_point_dtype_str() == after["floating_point_dtype_str"]

        for dtype in ("bfloat16", "float16"):
            after = facts[f"after_set_half_dtype_{dtype}"]
            amp.set_half_dtype(dtype)
            assert str(amp.get_half_dtype()) == after["half_dtype"]
            assert amp.get_half_dtype_str() == after["half_dtype_str"]
            assert str(amp.get_floating_point_dtype()) == after["floating_point_dtype"]

        half = torch.zeros(2, dtype=torch.float16)
        assert amp.is_cbfloat16_tensor(half) is facts["is_cbfloat16_tensor(float16 tensor)"]
    finally:
        amp.set_half_dtype(saved[0])
        amp.enable_mixed_precision(saved[1])


def test_amp_accepts_torch_dtypes_and_cbfloat16_and_refuses_others():
    amp = cstorch.amp
    saved = amp.get_half_dtype_str(), amp.mixed_precision()
    try:
        assert amp.set_half_dtype(torch.bfloat16) is torch.bfloat16
        assert amp.get_half_dtype_str() == "bfloat16"
        amp.set_half_dtype("cbfloat16")
        amp.enable_mixed_precision()
        assert amp.get_half_dtype_str() == amp.get_floating_point_dtype_str() == "cbfloat16"
        assert amp.get_half_dtype() is torch.float16  # what stands in for it (behaviour.json)
        with pytest.raises(ValueError, match="Invalid half dtype: float8"):
            amp.set_half_dtype("float8")
        with pytest.raises(ValueError, match="Invalid half dtype: torch.float32"):
            amp.set_half_dtype(torch.float32)
    finally:
        amp.set_half_dtype(saved[0])
        amp.enable_mixed_precision(saved[1])


def test_bad_arguments_say_what_was_wrong():
    m = cstorch.metrics
    with pytest.raises(ValueError, match="one prediction per label"):
        m.AccuracyMetric(name="a")(labels=torch.zeros(3), predictions=torch.zeros(4))
    with pytest.raises(ValueError, match="do not broadcast"):
        m.MeanMetric(name="m")(torch.zeros(3), torch.ones(2))
    # The wording of the real package (behaviour.json's metrics ctor_errors).
    with pytest.raises(ValueError, match="'num_classes' should be at least 2, got 1"):
        m.MeanIOUMetric(num_classes=1, name="iou")
    with pytest.raises(ValueError, match=r"has to be one of \['micro', 'macro'\]"):
        m.FBetaScoreMetric(num_classes=3, average_type="weighted", name="f")
    with pytest.raises(ValueError, match="leave none"):
        m.FBetaScoreMetric(num_classes=2, ignore_labels=[0, 1], name="f")
    with pytest.raises(ValueError, match="k=5 is more than the 4 classes"):
        m.PrecisionAtKMetric(k=5, name="p")(labels=torch.zeros(2, 1), predictions=torch.zeros(2, 4))
