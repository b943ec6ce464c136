"""The real package's example script runs unchanged and gives the real package's results."""
import json
import math
import os
import subprocess
import sys

import pytest
import torch

from tests.conftest import SHARED

EXAMPLES = os.path.join(SHARED, "examples")


def _close(a, b, tol=1e-4):
    return math.isclose(a, b, rel_tol=tol, abs_tol=tol * 1e-2)


def _digests_match(ours, theirs):
    assert ours.keys() == theirs.keys()
    for key, want in theirs.items():
        got = ours[key]
        if isinstance(want, str):
            assert got == want, key
            continue
        assert got["shape"] == want["shape"], key
        for field in ("sum", "abs"):
            # sums of many terms near zero: compare against the scale of the tensor
            assert abs(got[field] - want[field]) <= 1e-4 * max(abs(want[field]), want["abs"]), (key, field)
        for g, w in zip(got["first"], want["first"]):
            assert _close(g, w), key


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("train_mlp")
    env = {**os.environ, "OUT_DIR": str(out)}
    proc = subprocess.run([sys.executable, "train_mlp.py"], cwd=EXAMPLES, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(os.path.join(out, "train_mlp.json")) as f:
        result = json.load(f)
    return out, result, proc.stdout


def test_losses_and_steps_match_the_real_package(run):
    _, result, stdout = run
    with open(os.path.join(EXAMPLES, "train_mlp.expected.json")) as f:
        expected = json.load(f)
    assert "train_mlp ok" in stdout
    assert len(result["losses"]) == len(expected["losses"])
    for got, want in zip(result["losses"], expected["losses"]):
        assert _close(got, want), (got, want)
    assert result["closure_steps"] == expected["closure_steps"]
    assert result["ckpt_steps"] == expected["ckpt_steps"]
    _digests_match(result["final"], expected["final"])


def test_its_checkpoints_load_back(run):
    import cerebras.pytorch as cstorch
    sys.path.insert(0, EXAMPLES)
    try:
        from common import state_digest
    finally:
        sys.path.remove(EXAMPLES)
    out, result, _ = run
    for step in result["ckpt_steps"]:
        loaded = cstorch.load(os.path.join(out, f"mlp_ckpt_{step}.mdl"))
        assert loaded["step"] == step
        assert isinstance(loaded["model"]["0.weight"], torch.Tensor)
    # The step-5 checkpoint holds what the real package's step-5 checkpoint holds.
    with open(os.path.join(SHARED, "fixtures", "checkpoints", "real_mlp_step5.json")) as f:
        real = json.load(f)
    loaded = cstorch.load(os.path.join(out, "mlp_ckpt_5.mdl"))
    _digests_match(state_digest(loaded), real["loaded"])
