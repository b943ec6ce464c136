"""benchmarks.depth's repeated runs: medians per cell, every run's first step shown."""
import pytest

from benchmarks import depth


def test_median_result_takes_each_numbers_median_over_the_runs_that_succeeded():
    runs = [{"first_step_s": 3.0, "step_ms": 40.0, "loss": 6.9},
            {"error": "exit status 1"},
            {"first_step_s": 5.0, "step_ms": 44.0, "loss": 6.9},
            {"first_step_s": 4.0, "step_ms": 70.0, "loss": 6.9}]
    r = depth.median_result(runs)
    assert r["first_step_s"] == 4.0 and r["step_ms"] == 44.0 and r["loss"] == 6.9
    assert r["first_step_runs"] == [3.0, 5.0, 4.0]
    assert depth.median_result([{"error": "a"}, {"error": "b"}]) == {"error": "b"}


def test_table_gives_medians_with_every_first_step_and_the_growth_of_the_medians():
    results = {("cstorch", 2): depth.median_result([{"first_step_s": s, "step_ms": 40.0}
                                                    for s in (4.0, 6.0, 5.0)]),
               ("cstorch", 24): depth.median_result([{"first_step_s": s, "step_ms": 400.0}
                                                     for s in (9.0, 8.0, 12.0)])}
    text = depth.table(results, (2, 24), ("cstorch",))
    assert "| cstorch | 5.00 s [4.00, 6.00, 5.00] (40 ms/step) | " \
           "9.00 s [9.00, 8.00, 12.00] (400 ms/step) | 1.80x |" in text


def test_repeats_below_one_is_refused(capsys):
    with pytest.raises(SystemExit):
        depth.main(["--repeats", "0", "--no-write"])
    assert "--repeats must be at least 1" in capsys.readouterr().err
