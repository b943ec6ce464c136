"""cstorch.utils.nest, call_once, tracker.RateTracker and the parameter filters of
cstorch.utils.utils, with the calls Model Zoo makes."""
import collections
import threading

import pytest
import torch
import torch.utils._pytree as pytree

import cerebras.pytorch as cstorch
from cerebras.pytorch.utils.call_once import call_once
from cerebras.pytorch.utils.nest import recurse_spec, visit_structure, visit_torch_tensors
from cerebras.pytorch.utils.tracker import RateTracker
from cerebras.pytorch.utils.utils import FilterCallable, convert_glob_to_regex, make_param_filter

Point = collections.namedtuple("Point", ["x", "y"])


def test_recurse_spec_names_every_leaf_in_flatten_order():
    tree = {"model": {"fc.weight": torch.ones(2), "fc.bias": torch.zeros(2)},
            "optimizer": {"state": [1.0, {"m": 3}], "lr": 0.1},
            "point": Point(4, 5), "t": (6,)}
    values, spec = pytree.tree_flatten(tree)
    flat = dict(zip(map(".".join, recurse_spec(spec)), values))
    assert list(flat) == ["model.fc.weight", "model.fc.bias", "optimizer.state.0",
                          "optimizer.state.1.m", "optimizer.lr", "point.x", "point.y", "t.0"]
    assert flat["optimizer.state.1.m"] == 3 and flat["point.y"] == 5
    assert torch.equal(flat["model.fc.weight"], torch.ones(2))
    # A lone leaf has one, empty, scope; a prefix goes in front of every scope.
    assert list(recurse_spec(pytree.tree_flatten(7)[1])) == [[]]
    assert list(recurse_spec(pytree.tree_flatten([1, 2])[1], scope=["p"])) == [["p", "0"], ["p", "1"]]
    with pytest.raises(TypeError, match="TreeSpec"):
        list(recurse_spec({"a": 1}))


def test_visit_torch_tensors_skips_other_leaves_and_prefixes_the_scope():
    a, b, c = torch.arange(3), torch.ones(2, 2), torch.zeros(1)
    batch = {"input_ids": a, "meta": {"n": 3, "mask": b}, "extra": [None, c], "p": Point(c, "s")}
    got = [(".".join(s), t) for s, t in visit_torch_tensors(batch, scope=["input"])]
    assert [name for name, _ in got] == ["input.input_ids", "input.meta.mask", "input.extra.1",
                                         "input.p.x"]
    assert got[0][1] is a and got[1][1] is b and got[2][1] is c
    assert list(visit_torch_tensors(a)) == [([], a)]
    ints = list(visit_structure([1, "x", 2.0], lambda v: isinstance(v, int)))
    assert ints == [(["0"], 1)]
    with pytest.raises(TypeError, match="str at 1"):
        list(visit_structure([1, "x"], lambda v: isinstance(v, int), strict=True))


def test_call_once_runs_once_and_returns_the_first_result():
    calls = []

    @call_once()
    def setup(value):
        calls.append(value)
        return value * 2

    assert setup(3) == 6 and setup(10) == 6 and calls == [3]
    setup.reset()
    assert setup(5) == 10 and calls == [3, 5]

    class Holder:     # as Model Zoo decorates a static method
        @staticmethod
        @call_once()
        def hook():
            calls.append("hook")
            return "done"

    threads = [threading.Thread(target=Holder.hook) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls.count("hook") == 1


def test_call_once_retries_after_an_error_unless_told_not_to():
    attempts = []

    @call_once()
    def flaky():
        attempts.append(1)
        if len(attempts) == 1:
            raise RuntimeError("first")
        return "ok"

    with pytest.raises(RuntimeError):
        flaky()
    assert flaky() == "ok" and flaky() == "ok" and len(attempts) == 2

    @call_once(reset_on_error=False)
    def broken():
        attempts.append(2)
        raise ValueError("always")

    for _ in range(2):
        with pytest.raises(ValueError):
            broken()
    assert attempts.count(2) == 1
    with pytest.raises(TypeError, match="@call_once()"):
        call_once(lambda: None)


class _Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_rate_tracker_counts_and_rates_on_a_controlled_clock():
    clock = _Clock()
    tracker = cstorch.utils.tracker.RateTracker(smoothing=0.5, clock=clock)
    assert tracker.total_count == 0 and tracker.rate() == 0.0 and tracker.global_rate() == 0.0
    tracker.add(10)
    clock.now += 2.0
    assert tracker.rate() == pytest.approx(5.0)          # first interval: 10 / 2 s
    tracker.add(30)
    clock.now += 1.0
    assert tracker.rate() == pytest.approx(0.5 * 5.0 + 0.5 * 30.0)
    assert tracker.total_count == 40
    assert tracker.elapsed_seconds() == pytest.approx(3.0)
    assert tracker.global_rate() == pytest.approx(40 / 3.0)
    tracker.reset()
    assert tracker.total_count == 0 and tracker.elapsed_seconds() == 0.0
    clock.now += 4.0
    tracker.add(8)
    assert tracker.global_rate() == pytest.approx(2.0) and tracker.rate() == pytest.approx(2.0)
    with pytest.raises(ValueError):
        tracker.add(-1)
    assert isinstance(RateTracker(), RateTracker)        # default clock


def test_glob_filters_match_whole_parameter_names():
    pattern = convert_glob_to_regex("*proj_[qkv]_dense_layer.weight")
    assert pattern.search("layers.0.attn.proj_q_dense_layer.weight")
    assert not pattern.search("layers.0.attn.proj_o_dense_layer.weight")
    assert not pattern.search("layers.0.attn.proj_q_dense_layer.weight.extra")
    assert not convert_glob_to_regex("fc.*").search("model.fc.weight")   # anchored at the start
    assert convert_glob_to_regex(pattern) is pattern

    model = torch.nn.ModuleDict({"embedding": torch.nn.Embedding(4, 2),
                                 "decoder_dense": torch.nn.Linear(2, 2)})
    one = make_param_filter("*embedding*weight")
    many = make_param_filter(["*embedding*weight", "*decoder*dense*weight"])
    named = dict(model.named_parameters())
    assert [n for n, p in named.items() if one(n, p)] == ["embedding.weight"]
    assert [n for n, p in named.items() if many(n, p)] == ["embedding.weight",
                                                          "decoder_dense.weight"]
    custom: FilterCallable = lambda name, param: param.dim() == 1
    assert make_param_filter(custom) is custom
    with pytest.raises(TypeError, match="param_filter"):
        make_param_filter([3])
