"""`Schedule` and `Schedule.Range` against the real package (behaviour.json `schedule`):
field names, iteration, length, `start`, `final_step`, `range()`, `match`, `in`,
`next_immediate_step` and the construction errors, value for value."""
import dataclasses
import json
import os

import pytest

from cerebras.pytorch.utils.data import Schedule
from tests.conftest import SHARED

FIXTURE = json.load(open(os.path.join(SHARED, "fixtures", "behaviour.json")))["scenarios"]["schedule"]
Range = Schedule.Range


def _outcome(fn):
    try:
        return {"value": fn()}
    except Exception as e:   # the fixture records errors as type and message
        return {"error": type(e).__name__, "message": str(e)}


def _check(obj, recorded, probes=range(22), targets=range(23)):
    assert repr(obj) == recorded["repr"]
    assert list(obj) == recorded["list"]["value"]
    assert len(obj) == recorded["len"]["value"]
    assert obj.final_step == recorded["final_step"]["value"]
    start = recorded["start"]
    assert obj.start == (start["value"] if isinstance(start, dict) else start)
    if "range" in recorded:
        got = obj.range()
        got = [list((r.start, r.stop, r.step)) for r in got] if isinstance(obj, Schedule) \
            else [got.start, got.stop, got.step]
        assert got == recorded["range"]["value"]
    if "match" in recorded:
        assert {str(i): obj.match(i) for i in probes} == recorded["match"]
        assert {str(i): (i in obj) for i in probes} == recorded["in"]
        steps = {str(t): _outcome(lambda: obj.next_immediate_step(t))  # noqa: B023 (called now)
                 for t in targets}
        assert steps == recorded["next_immediate_step"]


def test_fields_and_methods():
    assert [f.name for f in dataclasses.fields(Schedule)] == FIXTURE["fields"]["Schedule"]
    assert [f.name for f in dataclasses.fields(Range)] == FIXTURE["fields"]["Range"]
    for cls in ("Schedule", "Range"):
        for name in FIXTURE["methods"][cls]:
            assert hasattr(globals()[cls] if cls == "Range" else Schedule, name)
    assert ("__contains__" in vars(Schedule)) == FIXTURE["methods"]["Schedule_has___contains__"]


def test_two_ranges():
    s = Schedule([Range(0, 10, 3, True), Range(12, 20, 4, False)])
    _check(s, FIXTURE["schedule_two_ranges"])


@pytest.mark.parametrize("key,args", [("range_0_10_3_include_last", (0, 10, 3, True)),
                                      ("range_0_9_3_include_last", (0, 9, 3, True)),
                                      ("range_2_11_4_no_last", (2, 11, 4, False))])
def test_single_ranges(key, args):
    _check(Range(*args), FIXTURE[key])


def test_empty_schedule():
    s = Schedule([])
    recorded = FIXTURE["schedule_empty"]
    assert repr(s) == recorded["repr"] and list(s) == [] and len(s) == 0
    assert s.start is None and s.final_step is None
    assert s.next_immediate_step(0) is None and s.match(0) is False


CONSTRUCTIONS = {
    "Schedule(intervals=[Range(2, 8, 2, True)]) -> list":
        lambda: list(Schedule(intervals=[Range(2, 8, 2, True)])),
    "Schedule(ranges=[Range(2, 8, 2, True)])": lambda: Schedule(ranges=[Range(2, 8, 2, True)]),
    "Range(start=1, end=5, step=1, include_last=False) -> list":
        lambda: list(Range(start=1, end=5, step=1, include_last=False)),
    "Range(0, 5)": lambda: Range(0, 5),
    "Range(0, 5, 1)": lambda: Range(0, 5, 1),
    "Range(-1, 5, 1, False)": lambda: Range(-1, 5, 1, False),
    "Range(1.0, 5, 1, False)": lambda: Range(1.0, 5, 1, False),
    "Range(5, 5, 1, False)": lambda: Range(5, 5, 1, False),
    "Range(5, 3, 1, False)": lambda: Range(5, 3, 1, False),
    "Range(0, 5, 0, False)": lambda: Range(0, 5, 0, False),
    "Range(0, 5, 1, 1)": lambda: Range(0, 5, 1, 1),
    "overlap: Schedule([Range(0, 10, 1, False), Range(5, 12, 1, False)])":
        lambda: Schedule([Range(0, 10, 1, False), Range(5, 12, 1, False)]),
    "adjacent: Schedule([Range(0, 5, 1, False), Range(5, 8, 1, False)]) -> list":
        lambda: list(Schedule([Range(0, 5, 1, False), Range(5, 8, 1, False)])),
    "unsorted: Schedule([Range(10, 12, 1, False), Range(0, 5, 1, False)])":
        lambda: Schedule([Range(10, 12, 1, False), Range(0, 5, 1, False)]),
    "non-Range element: Schedule([(0, 5, 1, False)])": lambda: Schedule([(0, 5, 1, False)]),
    "equality: Range(0,5,1,False) == Range(0,5,1,False)":
        lambda: Range(0, 5, 1, False) == Range(0, 5, 1, False),
}


@pytest.mark.parametrize("key", sorted(FIXTURE["construction"]))
def test_construction(key):
    assert _outcome(CONSTRUCTIONS[key]) == FIXTURE["construction"][key]
