"""behaviour.json `amp_dtypes`: the half dtype and mixed-precision getters after each call of
the real package's recorded sequence, with the same return values and errors."""
import builtins
import json
import os

import pytest
import torch

import cerebras.pytorch as cstorch
from tests.conftest import SHARED

SCENARIO = json.load(open(os.path.join(SHARED, "fixtures", "behaviour.json")))[
    "scenarios"]["amp_dtypes"]

GETTERS = ["mixed_precision()", "get_half_dtype()", "get_half_dtype_str()",
           "get_floating_point_dtype()", "get_floating_point_dtype_str()"]


def _call(text):
    """Run one recorded call (a Python expression on cstorch.amp) here."""
    return eval(text, {"torch": torch}, vars(cstorch.amp))


@pytest.fixture
def fresh_amp():
    amp = cstorch.amp
    saved = amp.get_half_dtype_str(), amp.mixed_precision()
    amp.set_half_dtype("float16")    # the state of a fresh process
    amp.enable_mixed_precision(False)
    yield amp
    amp.set_half_dtype(saved[0])
    amp.enable_mixed_precision(saved[1])


def test_the_recorded_sequence(fresh_amp):
    for entry in SCENARIO["sequence"]:
        call = entry["call"]
        if "returned" in entry:
            want = entry["returned"]
            if "error" in want:
                with pytest.raises(getattr(builtins, want["error"])) as info:
                    _call(call)
                assert str(info.value) == want["message"], call
            else:
                got = _call(call)
                assert (str(got) if isinstance(got, torch.dtype) else got) == want["value"], call
        for getter, want in entry["after"].items():
            got = _call(getter)
            got = str(got) if isinstance(got, torch.dtype) else got
            assert got == want["value"], f"after {call}: {getter}"


def test_set_half_dtype_turns_mixed_precision_on(fresh_amp):
    assert fresh_amp.mixed_precision() is False
    fresh_amp.set_half_dtype("bfloat16")
    assert fresh_amp.mixed_precision() is True
    assert fresh_amp.get_floating_point_dtype() is torch.bfloat16


def test_enable_mixed_precision_refuses_non_bools(fresh_amp):
    with pytest.raises(ValueError, match="Expected a boolean value"):
        fresh_amp.enable_mixed_precision("yes")
