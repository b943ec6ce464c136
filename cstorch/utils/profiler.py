"""`cstorch.utils.profiler`: what a `DataExecutor` measures while it runs.

An executor's `profiler` always tracks samples and rates (`profiler.rate_tracker`);
`DataExecutor(profiler_activities=[...])` adds user-defined `Activity` subclasses, each
told when the run starts, after every step (`update()`, as the real package calls it,
and `on_step(batch, samples)` with the step's batch) and when it ends. A
`cstorch.profiler.profile` that is open hears of every run too.
"""
import time
from typing import Any

from cstorch.profiler import ProfilerRegistry


class Activity:
    """Something measured over a run. Subclasses override the hooks they need and are
    constructed by the executor without arguments; the profiler holds each under its
    `name` (the class name by default): ``executor.profiler.activities[name]``, or
    ``executor.profiler.<name>``."""

    name: str | None = None

    def update(self) -> None:
        """A step finished: update the activity."""

    def on_start(self) -> None:
        """The run begins (before its first batch)."""

    def on_step(self, batch: Any, samples: int) -> None:
        """A step finished; `batch` is what it consumed, `samples` its batch size."""

    def on_stop(self) -> None:
        """The run ended."""

    def summary(self) -> dict[str, Any]:
        """The activity's results, for printing and logging."""
        return {}


class RateTracker(Activity):
    """Samples processed and the rates at which they were.

    - `total_samples`, `total_time` (seconds since the run started)
    - `rate`: the client-side rate in samples per second, smoothed over recent steps
    - `global_rate`: `total_samples / total_time`
    """

    name = "rate_tracker"

    def __init__(self, smoothing: float = 0.3):
        if not 0 < smoothing <= 1:
            raise ValueError(f"smoothing must be in (0, 1], got {smoothing}")
        self.smoothing = smoothing
        self.total_samples = 0
        self.total_steps = 0
        self.rate = 0.0
        self._start: float | None = None
        self._last: float | None = None
        self._end: float | None = None

    def on_start(self):
        self._start = self._last = time.perf_counter()
        self._end = None

    def on_step(self, batch, samples):
        now = time.perf_counter()
        elapsed = now - self._last
        self._last = now
        self.total_samples += samples
        self.total_steps += 1
        if elapsed > 0:
            instant = samples / elapsed
            # The first step includes compilation; later ones replace it quickly.
            self.rate = instant if self.total_steps == 1 else \
                self.smoothing * instant + (1 - self.smoothing) * self.rate

    def on_stop(self):
        self._end = time.perf_counter()

    @property
    def total_time(self) -> float:
        if self._start is None:
            return 0.0
        return (self._end or time.perf_counter()) - self._start

    @property
    def global_rate(self) -> float:
        total = self.total_time
        return self.total_samples / total if total > 0 else 0.0

    def summary(self):
        return {"total_samples": self.total_samples, "total_time": self.total_time,
                "rate": self.rate, "global_rate": self.global_rate}


class Profiler:
    """The activities of one executor run, by name: `profiler.rate_tracker`,
    `profiler.activities["name"]`."""

    def __init__(self, activities: list[type[Activity]] | None = None):
        self._profile = None   # the cstorch.profiler.profile open during the run
        self.rate_tracker = RateTracker()
        self.activities: dict[str, Activity] = {self.rate_tracker.name: self.rate_tracker}
        for cls in activities or []:
            if not (isinstance(cls, type) and issubclass(cls, Activity)):
                raise TypeError(
                    f"profiler_activities takes subclasses of cstorch.utils.profiler.Activity, "
                    f"got {cls!r}")
            activity = cls()
            name = activity.name or cls.__name__
            if name in self.activities:
                raise ValueError(f"two profiler activities are named {name!r}")
            self.activities[name] = activity

    def __getattr__(self, name):
        activities = self.__dict__.get("activities", {})
        if name in activities:
            return activities[name]
        raise AttributeError(f"the profiler has no activity {name!r}")

    def on_start(self, num_steps: int = 0, is_csx: bool = False):
        for a in self.activities.values():
            a.on_start()
        self._profile = ProfilerRegistry.get_profiler()
        if self._profile is not None:
            self._profile.configure_profiler(is_csx, num_steps)
            self._profile.on_run_start()

    def on_step(self, batch, samples):
        if len(self.activities) == 1:   # the rate tracker alone (runs every step)
            self.rate_tracker.on_step(batch, samples)
        else:
            for a in self.activities.values():
                a.on_step(batch, samples)
                a.update()
        if self._profile is not None:
            self._profile.on_run_step(samples)

    def on_stop(self):
        for a in self.activities.values():
            a.on_stop()
        if self._profile is not None:
            self._profile.on_run_stop()
            self._profile = None

    def summary(self) -> dict[str, dict[str, Any]]:
        return {name: a.summary() for name, a in self.activities.items()}
