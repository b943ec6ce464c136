"""`DynamicSparsityAlgorithm`: the base of algorithms that change their masks."""
from abc import abstractmethod

from cstorch.sparse.base import SparsityAlgorithm
from cstorch.sparse.utils import Cycling, ListSchedule, StepValues, make_update_schedule


class DynamicSparsityAlgorithm(SparsityAlgorithm):
    """An algorithm that updates its masks during training, on the steps of ``update``:
    None (every step), ``{"freq": N, "start": S, "stop": E}`` (every N optimizer steps
    from S, before E), ``{"steps": [...]}``, or an `UpdateSchedule`. The step counts the
    optimizer steps taken: the update after the first `optimizer.step()` is at step 1.

    ``sparsity`` may be a schedule (its value at each update step is the level the update
    aims at), a list of levels paired with ``update={"steps": [...]}`` (level i from
    step i on), or another list of levels (cycled through, `Cycling`).
    """

    dynamic = True

    def __init__(self, sparsity=None, update=None, **kwargs):
        self.update_schedule = make_update_schedule(update)
        if isinstance(sparsity, (list, tuple)):
            if isinstance(self.update_schedule, ListSchedule):
                sparsity = StepValues(sparsity, self.update_schedule.steps)
            else:
                sparsity = Cycling(sparsity)
        super().__init__(sparsity=sparsity, **kwargs)
        if self.sparsity is None:
            raise ValueError(f"{type(self).__name__} needs a sparsity level or schedule: "
                             "sparsity=")

    @abstractmethod
    def update_mask(self, p, mask, sparsity):
        """The new mask (see `SparsityAlgorithm.update_mask`)."""
