"""`LambdaLR`: each group's initial rate times a user function of the step."""
import torch

from cstorch.optim.lr_scheduler.scheduler import LRScheduler


class LambdaLR(LRScheduler):
    """``base_lr * lr_lambda(t)`` per driven param group, ``base_lr`` being the group's rate
    when the scheduler was made. `lr_lambda` (one function, or one per group) receives the
    step as a float32 tensor and must use torch ops on it (no ``.item()``, no Python
    branching on it), since inside a traced step it is a traced value."""

    def __init__(self, optimizer: torch.optim.Optimizer, lr_lambda, param_group_tags=None):
        self.lr_lambda = lr_lambda
        super().__init__(optimizer, None, param_group_tags=param_group_tags)

    def values_at(self, step):
        fns = self.lr_lambda if isinstance(self.lr_lambda, (list, tuple)) else [self.lr_lambda] * len(self._groups)
        if len(fns) != len(self._groups):
            raise ValueError(f"expected {len(self._groups)} lr_lambdas, got {len(fns)}")
        return [base * torch.as_tensor(fn(step), dtype=torch.float32) for base, fn in zip(self.base_lrs, fns)]
