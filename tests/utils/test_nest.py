"""cerebras.pytorch.utils.nest beyond visiting: the visit-function registry, mapping,
diff, lazy/device tensors, and the registry's serialization."""
import collections

import pytest
import torch

import cerebras.pytorch as cstorch
from cerebras.pytorch.utils import nest

Point = collections.namedtuple("Point", ["x", "y"])


class Pair:
    """A container the registry does not know until a visit function is registered."""

    def __init__(self, left, right):
        self.left, self.right = left, right


def visit_pair(pair):
    yield ["left"], pair.left
    yield ["right"], pair.right


def test_visit_fns_of_lists_tuples_and_dicts():
    assert list(nest.visit_list_tuple([5, 6])) == [(["0"], 5), (["1"], 6)]
    assert list(nest.visit_dict({"a": 1})) == [(["a"], 1)]
    assert nest.find_visit_fn((1,)) is nest.visit_list_tuple
    assert nest.find_visit_fn(collections.OrderedDict()) is nest.visit_dict
    assert nest.find_visit_fn(3) is None


def test_register_and_unregister_a_visit_fn():
    t = torch.ones(2)
    data = {"p": Pair(t, [t, 1])}
    assert list(nest.visit_torch_tensors(data)) == []   # Pair is a leaf
    nest.register_visit_fn(Pair)(visit_pair)
    try:
        assert nest.find_visit_fn(Pair(1, 2)) is visit_pair
        assert [s for s, _ in nest.visit_torch_tensors(data)] == [["p", "left"], ["p", "right", "0"]]
        assert nest.serialize_visit_fns()[f"{__name__}.Pair"] == f"{__name__}.visit_pair"
    finally:
        nest.unregister_visit_fn(Pair)
    assert nest.find_visit_fn(Pair(1, 2)) is None
    nest.deserialize_visit_fns({f"{__name__}.Pair": f"{__name__}.visit_pair"})
    try:
        assert nest.find_visit_fn(Pair(1, 2)) is visit_pair
    finally:
        nest.unregister_visit_fn(Pair)
    with pytest.raises(TypeError, match="takes types"):
        nest.register_visit_fn("Pair")


def test_map_structure_rebuilds_containers_and_passes_scopes():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(3, generator=g), torch.randn(2, generator=g)
    data = {"a": a, "rest": [Point(b, "s"), (b, 4)], "o": collections.OrderedDict(k=a)}
    scopes = []

    def double(scope, t):
        scopes.append(".".join(scope))
        return t * 2

    out = nest.map_torch_tensors(double, data)
    assert scopes == ["a", "rest.0.x", "rest.1.0", "o.k"]
    assert torch.equal(out["a"], a * 2) and torch.equal(out["rest"][1][0], b * 2)
    assert isinstance(out["rest"][0], Point) and out["rest"][0].y == "s"
    assert isinstance(out["rest"][1], tuple) and out["rest"][1][1] == 4
    assert isinstance(out["o"], collections.OrderedDict)
    assert torch.equal(data["a"], a)   # the input is left as it was
    ints = nest.map_structure(lambda v: v + 1, [1, "x", [2]], lambda v: isinstance(v, int))
    assert ints == [2, "x", [3]]
    assert nest.map_torch_tensors(lambda s, t: s, a, scope=["top"]) == ["top"]


def test_diff_names_every_difference():
    t = torch.arange(4.0)
    left = {"a": t, "b": [1, 2], "c": {"d": 1}, "only_left": 0}
    right = {"a": t + 1, "b": [1, 3], "c": [1], "only_right": 0}
    got = nest.diff(left, right)
    assert got == ["a: tensor(shape=(4,), dtype=torch.float32) vs tensor(shape=(4,), "
                   "dtype=torch.float32)", "b.1: 2 vs 3", "c: dict vs list",
                   "only_left: only in the first structure",
                   "only_right: only in the second structure"]
    assert nest.diff(left, dict(left)) == []


def test_device_and_lazy_tensors():
    cstorch.backend("CPU")
    model = torch.nn.Linear(2, 1)
    cstorch.compile(model)
    host = torch.zeros(1)
    data = {"w": model.weight, "h": host}
    assert [s for s, _ in nest.visit_lazy_tensors(data)] == [["w"]]
    assert [s for s, _ in nest.visit_device_tensors(data, "cpu")] == [["w"], ["h"]]
    assert list(nest.visit_device_tensors(data, "cuda")) == []
    mapped = nest.map_lazy_tensors(lambda s, t: ".".join(s), data)
    assert mapped == {"w": "w", "h": host}
    with pytest.raises(TypeError, match="unexpected Tensor at h"):
        list(nest.visit_lazy_tensors(data, strict=True))
