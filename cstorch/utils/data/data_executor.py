"""`cerebras.pytorch.utils.data.data_executor`: the `DataExecutor` and its types."""
from typing import Literal

from cstorch.utils.data.executor import DataExecutor, current_executor

__all__ = ["DataExecutor", "current_executor", "MbsSetting"]

MbsSetting = (int | Literal["auto", "explore"] | dict[str, dict]
              | dict[str, int | Literal["auto"] | None] | None)
"""A micro-batch size setting, as `cstorch.backends.csx.performance.micro_batch_size`
takes it: None (whole batches), a positive int, "auto", "explore",
``{"explore": {"min": int, "max": int}}``, or a dict of those keyed by traced step name."""
