"""`cstorch.utils.profiler`: what a `DataExecutor` measures while it runs.

An executor's `profiler` always tracks samples and rates (`profiler.rate_tracker`);
`DataExecutor(profiler_activities=[...])` adds user-defined `Activity` subclasses, each
told when the run starts, after every step (with the step's batch) and when it ends.
"""
import time
from typing import Any, Dict, List, Optional, Type

# Objects told about every executor run (`cstorch.profiler.profile` while it is open):
# each has on_run_start(), on_run_step(samples) and on_run_stop().
_run_listeners: List[Any] = []


def add_run_listener(listener) -> None:
    """Tell `listener` about every executor run from now on."""
    _run_listeners.append(listener)


def remove_run_listener(listener) -> None:
    if listener in _run_listeners:
        _run_listeners.remove(listener)


class Activity:
    """Something measured over a run. Subclasses override the hooks they need and are
    constructed by the executor without arguments."""

    name: Optional[str] = None

    def on_start(self) -> None:
        """The run begins (before its first batch)."""

    def on_step(self, batch: Any, samples: int) -> None:
        """A step finished; `batch` is what it consumed, `samples` its batch size."""

    def on_stop(self) -> None:
        """The run ended."""

    def summary(self) -> Dict[str, Any]:
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
        self._start: Optional[float] = None
        self._last: Optional[float] = None
        self._end: Optional[float] = None

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

    def __init__(self, activities: Optional[List[Type[Activity]]] = None):
        self.rate_tracker = RateTracker()
        self.activities: Dict[str, Activity] = {self.rate_tracker.name: self.rate_tracker}
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

    def on_start(self):
        for a in self.activities.values():
            a.on_start()
        for listener in list(_run_listeners):
            listener.on_run_start()

    def on_step(self, batch, samples):
        if len(self.activities) == 1:   # the rate tracker alone (runs every step)
            self.rate_tracker.on_step(batch, samples)
        else:
            for a in self.activities.values():
                a.on_step(batch, samples)
        if _run_listeners:   # runs every step: no list copy when nobody listens
            for listener in list(_run_listeners):
                listener.on_run_step(samples)

    def on_stop(self):
        for a in self.activities.values():
            a.on_stop()
        for listener in list(_run_listeners):
            listener.on_run_stop()

    def summary(self) -> Dict[str, Dict[str, Any]]:
        return {name: a.summary() for name, a in self.activities.items()}
