"""Cluster clients.

`TelemetryClient` sends metrics to a Cerebras cluster's telemetry service (dashboards of
a Wafer-Scale Cluster). There is no such service here: the client accepts and checks
what it is given, and drops it. Model Zoo creates one only when `backend.is_csx`.
"""
import logging
from typing import Any

_logger = logging.getLogger("cerebras.appliance.cluster")


class TelemetryClient:
    """Accepts metrics for a cluster's telemetry service and discards them (no cluster).

    Same shape as on a Cerebras system: built from a management client and buffer limits,
    used as a context manager, fed with `push(metrics, labels)`. `mgmt_client` may be
    anything, None included; it is not used. Metrics are checked (a dict of name to
    number, labels a dict of str to str) so a program that would fail on a cluster fails
    here too, then dropped; `flush()` does nothing.
    """

    def __init__(self, mgmt_client: Any = None, max_buffer_size: int = 128,
                 max_buffer_seconds: float = 150):
        if int(max_buffer_size) < 1:
            raise ValueError(f"max_buffer_size must be at least 1, got {max_buffer_size}")
        if float(max_buffer_seconds) <= 0:
            raise ValueError(f"max_buffer_seconds must be positive, got {max_buffer_seconds}")
        self.mgmt_client = mgmt_client
        self.max_buffer_size = int(max_buffer_size)
        self.max_buffer_seconds = float(max_buffer_seconds)
        self._warned = False

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.flush()
        return False

    def push(self, metrics: dict[str, Any], labels: dict[str, str] | None = None) -> None:
        """Check `metrics` (name -> number) and `labels` (str -> str), then drop them."""
        if not isinstance(metrics, dict):
            raise TypeError(f"metrics must be a dict of name to number, got "
                            f"{type(metrics).__name__}")
        for name, value in metrics.items():
            if not isinstance(name, str):
                raise TypeError(f"metric names must be str, got {name!r}")
            try:
                float(value)
            except (TypeError, ValueError) as e:
                raise TypeError(f"metric {name!r} must be a number, got {value!r}") from e
        for key, value in (labels or {}).items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise TypeError(f"telemetry labels are str -> str, got {key!r}: {value!r}")
        if not self._warned:
            _logger.debug("no Cerebras cluster: telemetry metrics are dropped")
            self._warned = True

    def flush(self) -> None:
        """Nothing is buffered (no telemetry service), so there is nothing to send."""


__all__ = ["TelemetryClient"]
