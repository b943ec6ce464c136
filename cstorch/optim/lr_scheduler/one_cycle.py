"""`OneCycleLR`: the 1cycle policy (Smith & Topin, 2018)."""
import math

import torch

from cstorch.optim.lr_scheduler.scheduler import LRScheduler


class OneCycleLR(LRScheduler):
    """Warm up from ``initial_learning_rate`` to ``max_lr`` until step
    ``pct_start * total_steps - 1``, then anneal to ``final_lr`` at ``total_steps - 1``
    (``three_phase``: back down to the initial rate first, until ``2 * pct_start *
    total_steps - 2``). ``anneal_strategy`` is "cos" or "linear". ``final_lr`` defaults to
    ``initial_learning_rate / 1e4``. Past ``total_steps`` the last phase's curve simply
    continues.
    """

    def __init__(self, optimizer: torch.optim.Optimizer,
                 initial_learning_rate, max_lr, total_steps=1000, pct_start=0.3,
                 final_lr=None, three_phase=False, anneal_strategy="cos", param_group_tags=None):
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"anneal_strategy must be 'cos' or 'linear', got {anneal_strategy!r}")
        self.initial_learning_rate = initial_learning_rate
        self.max_lr = max_lr
        self.total_steps = total_steps
        self.pct_start = pct_start
        self.final_lr = initial_learning_rate / 1e4 if final_lr is None else final_lr
        self.three_phase = three_phase
        self.anneal_strategy = anneal_strategy
        super().__init__(optimizer, total_steps, param_group_tags=param_group_tags)

    def _phases(self):
        up = float(self.pct_start * self.total_steps) - 1
        last = float(self.total_steps - 1)
        if self.three_phase:
            down = float(2 * self.pct_start * self.total_steps) - 2
            return [(up, self.initial_learning_rate, self.max_lr),
                    (down, self.max_lr, self.initial_learning_rate),
                    (last, self.initial_learning_rate, self.final_lr)]
        return [(up, self.initial_learning_rate, self.max_lr), (last, self.max_lr, self.final_lr)]

    def _anneal(self, start, end, pct):
        if self.anneal_strategy == "cos":
            return end + (start - end) / 2 * (1 + torch.cos(math.pi * pct))
        return start + (end - start) * pct

    def lr_at(self, step):
        phases = self._phases()
        lr = None
        begin = 0.0
        for i, (end_step, start_lr, end_lr) in enumerate(phases):
            value = self._anneal(start_lr, end_lr, (step - begin) / (end_step - begin))
            # Later phases are selected by overriding earlier ones where the step lies past
            # the earlier phase's end.
            lr = value if lr is None else torch.where(step > begin, value, lr)
            begin = end_step
        return lr
