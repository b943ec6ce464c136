"""`cerebras.pytorch.profiler`: a timeline of the steps executors run.

``with cstorch.profiler.profile(schedule=cstorch.profiler.schedule(start_step=2,
end_step=5)) as prof: ...`` records, for every `DataExecutor` run inside, the wall-clock
span of each step the schedule selects (from the end of one step to the end of the next,
so data loading and the step's dispatch count, and the first step includes compiling).
`prof.export_chrome_trace(path)` writes them in Chrome's trace event format (open in
Perfetto or chrome://tracing), `prof.get_summary()` gives a table of step times.

On a Cerebras system the profiler also collects per-op timings from the appliance
(`appliance_response`) and from the hosts named in `host_activities`. Here there is no
appliance: `appliance_response` is None and `host_activities` is stored only. For
op-level timings of a lowered step, profile it with `jax.profiler` (XLA names each op
after its ATen op and model line).
"""
import json
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from cstorch.utils.profiler import add_run_listener, remove_run_listener

__all__ = ["profile", "schedule", "ProfilerSchedule"]


@dataclass(frozen=True)
class ProfilerSchedule:
    """Which steps of a run are recorded: those numbered `start_step` to `end_step`
    inclusive (steps are numbered from 1 in each executor run); -1 leaves that end open."""
    start_step: int = -1
    end_step: int = -1

    def __contains__(self, step: int) -> bool:
        return (self.start_step < 0 or step >= self.start_step) and \
            (self.end_step < 0 or step <= self.end_step)


def schedule(*, start_step: int = -1, end_step: int = -1) -> ProfilerSchedule:
    """The steps a `profile` records: `start_step` to `end_step` inclusive, numbered from
    1 within each executor run; -1 (default) leaves that end open."""
    for name, value in (("start_step", start_step), ("end_step", end_step)):
        if not isinstance(value, int) or isinstance(value, bool) or (value < 1 and value != -1):
            raise ValueError(f"{name} must be a positive int or -1, got {value!r}")
    if start_step > 0 and 0 < end_step < start_step:
        raise ValueError(f"end_step {end_step} comes before start_step {start_step}")
    return ProfilerSchedule(start_step, end_step)


class profile:
    """Record the steps executors run while the profile is open (see the module doc).

    - `schedule`: a `ProfilerSchedule` (`schedule(...)`); None records every step;
    - `host_activities`: on a Cerebras system, the hosts (ACT, WGT, CSX numbers) whose
      activity to collect; stored only, as there are no such hosts here.

    After the block, `events` lists each recorded step as a dict (`run`, `step`,
    `start_s`, `duration_s`, `samples`).
    """

    def __init__(self, schedule: Optional[ProfilerSchedule] = None,
                 host_activities: Optional[List[str]] = None, **kwargs):
        if schedule is not None and not isinstance(schedule, ProfilerSchedule):
            raise TypeError(f"schedule must come from cstorch.profiler.schedule(), got "
                            f"{type(schedule).__name__}")
        self.schedule = schedule or ProfilerSchedule()
        self.host_activities = list(host_activities or [])
        self.options: Dict[str, Any] = kwargs
        self.appliance_response = None
        self.events: List[Dict[str, Any]] = []
        self._runs: List[dict] = []       # open runs, innermost last
        self._run_count = 0
        self._origin = time.perf_counter()
        self._open = False

    # the context ---------------------------------------------------------------------
    def __enter__(self):
        if self._open:
            raise RuntimeError("this profile is already open")
        self._open = True
        self._origin = time.perf_counter()
        add_run_listener(self)
        return self

    def __exit__(self, *exc):
        remove_run_listener(self)
        self._open = False
        self._runs.clear()
        return False

    # told by every executor run ----------------------------------------------------------
    def on_run_start(self):
        self._run_count += 1
        self._runs.append({"run": self._run_count, "step": 0, "last": time.perf_counter()})

    def on_run_step(self, samples: int):
        if not self._runs:
            self.on_run_start()      # a run that began before the profile opened
        run = self._runs[-1]
        now = time.perf_counter()
        run["step"] += 1
        if run["step"] in self.schedule:
            self.events.append({"run": run["run"], "step": run["step"],
                                "start_s": run["last"] - self._origin,
                                "duration_s": now - run["last"], "samples": samples})
        run["last"] = now

    def on_run_stop(self):
        if self._runs:
            self._runs.pop()

    # results -------------------------------------------------------------------------
    def export_chrome_trace(self, path) -> None:
        """Write the recorded steps to `path` as a Chrome trace (JSON): one complete event
        per step, one track per executor run."""
        events = [{"name": f"step {e['step']}", "ph": "X", "pid": os.getpid(), "tid": e["run"],
                   "ts": e["start_s"] * 1e6, "dur": e["duration_s"] * 1e6,
                   "cat": "step", "args": {"samples": e["samples"]}} for e in self.events]
        for run in sorted({e["run"] for e in self.events}):
            events.append({"name": "thread_name", "ph": "M", "pid": os.getpid(), "tid": run,
                           "args": {"name": f"executor run {run}"}})
        path = os.fspath(path)
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        with open(path, "w") as f:
            json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)

    def get_summary(self) -> str:
        """A table of the recorded steps' times, per executor run."""
        if not self.events:
            return "no steps were recorded"
        lines = [f"{'run':>4} {'steps':>6} {'mean ms':>10} {'min ms':>10} {'max ms':>10} "
                 f"{'samples/s':>10}"]
        for run in sorted({e["run"] for e in self.events}):
            mine = [e for e in self.events if e["run"] == run]
            times = [e["duration_s"] for e in mine]
            total = sum(times)
            rate = sum(e["samples"] for e in mine) / total if total > 0 else 0.0
            lines.append(f"{run:>4} {len(mine):>6} {1e3 * statistics.fmean(times):>10.3f} "
                         f"{1e3 * min(times):>10.3f} {1e3 * max(times):>10.3f} {rate:>10.1f}")
        return "\n".join(lines)
