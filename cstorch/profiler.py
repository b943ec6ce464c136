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
import gzip
import json
import os
import socket
import statistics
import time
import warnings
from dataclasses import dataclass
from typing import Any, Optional
from collections.abc import Callable

__all__ = ["profile", "schedule", "ProfilerSchedule", "ProfilerRegistry",
           "tensorboard_trace_handler"]


@dataclass(frozen=True)
class ProfilerSchedule:
    """Which steps of a run are recorded: those numbered `start_step` to `end_step`
    inclusive (steps are numbered from 1 in each executor run); -1 leaves that end open."""
    start_step: int = -1
    end_step: int = -1

    def __contains__(self, step: int) -> bool:
        return (self.start_step < 0 or step >= self.start_step) and \
            (self.end_step < 0 or step <= self.end_step)


def schedule(*, start_step: int, end_step: int) -> ProfilerSchedule:
    """The steps a `profile` records: `start_step` to `end_step` inclusive, numbered from
    1 within each executor run; -1 leaves that end open."""
    for name, value in (("start_step", start_step), ("end_step", end_step)):
        if not isinstance(value, int) or isinstance(value, bool) or (value < 1 and value != -1):
            raise ValueError(f"{name} must be a positive int or -1, got {value!r}")
    if start_step > 0 and 0 < end_step < start_step:
        raise ValueError(f"end_step {end_step} comes before start_step {start_step}")
    return ProfilerSchedule(start_step, end_step)


class ProfilerRegistry:
    """The profile that is open (at most one): executors report their steps to it."""

    _profiler: Optional["profile"] = None

    @classmethod
    def get_profiler(cls) -> Optional["profile"]:
        """The open profile, or None."""
        return cls._profiler

    @classmethod
    def set_profiler(cls, profiler: "profile") -> None:
        """Make `profiler` the open profile; an error while another one is open."""
        if cls._profiler is not None and cls._profiler is not profiler:
            raise RuntimeError("a cstorch.profiler.profile is already open; close it before "
                               "opening another")
        cls._profiler = profiler

    @classmethod
    def unset_profiler(cls) -> None:
        """No profile is open any more."""
        cls._profiler = None


def tensorboard_trace_handler(dir_name, worker_name: str | None = None,
                              use_gzip: bool = False) -> Callable[["profile"], None]:
    """An `on_trace_ready` handler writing the profile's Chrome trace into `dir_name` as
    ``{worker_name}.{time in ns}.pt.trace.json`` (``.gz`` with `use_gzip`), where the
    TensorBoard profiler plugin finds it. `worker_name` defaults to ``{host}_{pid}``."""
    directory = os.fspath(dir_name)

    def handler(prof: "profile") -> None:
        os.makedirs(directory, exist_ok=True)
        worker = worker_name or f"{socket.gethostname()}_{os.getpid()}"
        name = f"{worker}.{time.time_ns()}.pt.trace.json" + (".gz" if use_gzip else "")
        prof.export_chrome_trace(os.path.join(directory, name))
    return handler


class profile:
    """Record the steps executors run while the profile is open (see the module doc).

    - `schedule`: the steps to record, from `cstorch.profiler.schedule(...)`;
    - `host_activities`: on a Cerebras system, the hosts (ACT, WGT, CSX numbers) whose
      activity to collect; stored only, as there are no such hosts here;
    - `on_trace_ready`: called with the profile once it closes and its trace is complete
      (e.g. `tensorboard_trace_handler(dir)`).

    After the block, `events` lists each recorded step as a dict (`run`, `step`,
    `start_s`, `duration_s`, `samples`).
    """

    def __init__(self, *, schedule: ProfilerSchedule, host_activities: list[str] | None = None,
                 on_trace_ready: Callable[["profile"], Any] | None = None):
        if not isinstance(schedule, ProfilerSchedule):
            raise TypeError(f"schedule must come from cstorch.profiler.schedule(), got "
                            f"{type(schedule).__name__}")
        if on_trace_ready is not None and not callable(on_trace_ready):
            raise TypeError(f"on_trace_ready must be a callable taking the profile, got "
                            f"{type(on_trace_ready).__name__}")
        self.schedule = schedule
        self.host_activities = list(host_activities or [])
        self.on_trace_ready = on_trace_ready
        self.appliance_response = None
        self.events: list[dict[str, Any]] = []
        self._runs: list[dict] = []       # open runs, innermost last
        self._run_count = 0
        self._origin = time.perf_counter()
        self._open = False

    # the context ---------------------------------------------------------------------
    def __enter__(self):
        if self._open:
            raise RuntimeError("this profile is already open")
        ProfilerRegistry.set_profiler(self)
        self._open = True
        self._origin = time.perf_counter()
        return self

    def __exit__(self, *exc):
        ProfilerRegistry.unset_profiler()
        self._open = False
        self._runs.clear()
        if self.on_trace_ready is not None and exc[0] is None:
            self.on_trace_ready(self)
        return False

    def configure_profiler(self, is_csx: bool, num_steps: int) -> None:
        """Called by an executor when its run of `num_steps` steps starts (`is_csx`: on
        the CSX backend). Warns when the schedule starts after the run's last step: such a
        run records nothing."""
        start = self.schedule.start_step
        if start > num_steps:
            warnings.warn(f"cstorch.profiler.profile: the schedule starts at step {start} but "
                          f"the run has {num_steps} steps, so it records nothing", stacklevel=3)

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
        """Write the recorded steps to `path` as a Chrome trace (JSON, gzipped when the
        path ends in ``.gz``): one complete event per step, one track per executor run."""
        events = [{"name": f"step {e['step']}", "ph": "X", "pid": os.getpid(), "tid": e["run"],
                   "ts": e["start_s"] * 1e6, "dur": e["duration_s"] * 1e6,
                   "cat": "step", "args": {"samples": e["samples"]}} for e in self.events]
        for run in sorted({e["run"] for e in self.events}):
            events.append({"name": "thread_name", "ph": "M", "pid": os.getpid(), "tid": run,
                           "args": {"name": f"executor run {run}"}})
        path = os.fspath(path)
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "wt") as f:
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
