"""Files written by the real package load to the values recorded beside them."""
import importlib.util
import json
import math
import os

import pytest
import torch

import cstorch


def _common(fixtures_dir):
    spec = importlib.util.spec_from_file_location("fixture_common", os.path.join(fixtures_dir, "common.py"))
    mod = importlib.util.module_from_spec(spec)
    os.environ.setdefault("OUT_DIR", "/tmp/holdout_out")
    spec.loader.exec_module(mod)
    return mod


def _close(a, b):
    if isinstance(a, dict):
        assert a["shape"] == b["shape"]
        for field in ("sum", "abs"):
            assert math.isclose(a[field], b[field], rel_tol=1e-9, abs_tol=1e-9), (field, a, b)
        assert all(math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12) for x, y in zip(a["first"], b["first"]))
    else:
        assert a == b


@pytest.mark.parametrize("name,field", [("rich", "loaded"), ("rich", "written"), ("lz4", "written"),
                                        ("objects", "loaded"), ("mlp_step5", "loaded")])
@pytest.mark.parametrize("map_location", [None, "cache", "cpu"])
def test_real_file_matches_digest(fixtures_dir, name, field, map_location):
    common = _common(fixtures_dir)
    with open(os.path.join(fixtures_dir, f"real_{name}.json")) as f:
        expected = json.load(f)[field]
    loaded = cstorch.load(os.path.join(fixtures_dir, f"real_{name}.mdl"), map_location=map_location)
    got = common.state_digest(loaded)
    for key, want in expected.items():
        assert key in got, key
        _close(got[key], want)


def test_real_rich_types_and_ties(fixtures_dir):
    with open(os.path.join(fixtures_dir, "real_rich.json")) as f:
        digest = json.load(f)
    loaded = cstorch.load(os.path.join(fixtures_dir, "real_rich.mdl"))
    for key, tname in digest["types"].items():
        if tname == "DeferredTorchTensor":
            assert isinstance(loaded[key], torch.Tensor), key
        else:
            assert type(loaded[key]).__name__ == tname, key
    assert loaded["model"]["tied_a"] is loaded["model"]["tied_b"]
    assert digest["tied_is_same"]
    assert isinstance(loaded["nested"]["tuple"], tuple)
    assert loaded["bf16"].dtype == torch.bfloat16 and loaded["half"].dtype == torch.float16
    assert loaded["mask"].dtype == torch.bool and loaded["ints"].dtype == torch.int64
    assert loaded["scalar_t"].shape == () and loaded["empty"].shape == (0, 4)


def test_real_objects(fixtures_dir):
    with open(os.path.join(fixtures_dir, "real_objects.json")) as f:
        digest = json.load(f)
    loaded = cstorch.load(os.path.join(fixtures_dir, "real_objects.mdl"))
    assert isinstance(loaded["a_set"], set) and sorted(loaded["a_set"]) == digest["a_set"]
    assert type(loaded["counter"]).__name__ == "Counter" and dict(loaded["counter"]) == digest["counter"]
    assert loaded["date"].isoformat() == digest["date"]
    assert loaded["raw"].hex() == digest["raw"]
    assert loaded["ones_bf16"].dtype == torch.bfloat16


def test_real_mlp_loads_into_module(fixtures_dir):
    loaded = cstorch.load(os.path.join(fixtures_dir, "real_mlp_step5.mdl"))
    assert type(loaded["model"]).__name__ == "OrderedDict"
    model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                                torch.nn.ReLU(), torch.nn.Linear(64, 5))
    model.load_state_dict(loaded["model"])
    assert torch.equal(model[0].weight.detach(), loaded["model"]["0.weight"])
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt.load_state_dict(loaded["optimizer"])
    assert opt.param_groups[0]["lr"] == 0.05
    assert loaded["step"] == 5
