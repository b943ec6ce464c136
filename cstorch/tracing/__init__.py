"""Traced steps: capture once, run as one compiled program ever after."""
from cstorch.run.capture_context import capturing
from cstorch.tracing.step import JaxStep, TracedStep

__all__ = ["TracedStep", "JaxStep", "capturing"]
