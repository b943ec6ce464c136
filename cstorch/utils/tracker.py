"""`cerebras.pytorch.utils.tracker`: counting samples and the rate they go at."""
import time

__all__ = ["RateTracker"]


class RateTracker:
    """Counts what is processed (samples, say) and the rate at which it is, as seen by the
    client's clock.

    - `add(count)`: `count` more were processed now;
    - `rate()`: the smoothed rate (per second) over what was added since the last call
      of `rate()`: each call blends the rate of that interval into the previous value,
      ``smoothing * old + (1 - smoothing) * new`` (the first call takes the new value);
    - `global_rate()`: everything added since the last `reset()` over the time since then;
    - `elapsed_seconds()`: seconds since the last `reset()` (or construction);
    - `total_count`: everything added since the last `reset()`.
    """

    def __init__(self, smoothing: float = 0.4, clock=time.monotonic):
        if not 0 <= smoothing < 1:
            raise ValueError(f"smoothing must be in [0, 1), got {smoothing}")
        self.smoothing = smoothing
        self._clock = clock
        self.reset()

    def reset(self) -> None:
        """Start again: counts, rates and the clock."""
        now = self._clock()
        self._start = now
        self._last_time = now
        self._last_count = 0
        self._rate: float | None = None
        self.total_count = 0

    def add(self, count) -> None:
        """`count` more were processed."""
        if count < 0:
            raise ValueError(f"RateTracker.add expects a non-negative count, got {count}")
        self.total_count += count

    def rate(self) -> float:
        """The smoothed rate of what was added since the last call (0.0 before any time
        has passed)."""
        now = self._clock()
        elapsed = now - self._last_time
        if elapsed > 0:
            new = (self.total_count - self._last_count) / elapsed
            self._rate = new if self._rate is None else \
                self.smoothing * self._rate + (1 - self.smoothing) * new
            self._last_time, self._last_count = now, self.total_count
        return self._rate if self._rate is not None else 0.0

    def global_rate(self) -> float:
        """`total_count` over the seconds since the last `reset()` (0.0 at time zero)."""
        elapsed = self.elapsed_seconds()
        return self.total_count / elapsed if elapsed > 0 else 0.0

    def elapsed_seconds(self) -> float:
        """Seconds since the last `reset()`."""
        return self._clock() - self._start

    def __repr__(self):
        return (f"RateTracker(total_count={self.total_count}, "
                f"elapsed_seconds={self.elapsed_seconds():.3f})")
