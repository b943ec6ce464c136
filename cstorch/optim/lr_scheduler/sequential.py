"""`SequentialLR`: schedules one after another, each starting from its own step 0."""
import torch

from cstorch.optim.lr_scheduler.scheduler import LRScheduler


class SequentialLR(LRScheduler):
    """Run ``schedulers[0]`` until ``milestones[0]``, then ``schedulers[1]`` from its step 0,
    and so on. The sub-schedulers only supply their formulas; this scheduler's own counter
    drives them."""

    def __init__(self, optimizer, schedulers, milestones, last_epoch=-1, param_group_tags=None):
        if len(milestones) != len(schedulers) - 1:
            raise ValueError("SequentialLR expects one milestone fewer than schedulers, got "
                             f"{len(schedulers)} schedulers and {len(milestones)} milestones")
        if any(s.optimizer is not optimizer for s in schedulers):
            raise ValueError("SequentialLR's schedulers must all drive the same optimizer")
        self.schedulers = list(schedulers)
        self.milestones = list(milestones)
        super().__init__(optimizer, None, last_epoch, param_group_tags=param_group_tags)

    def lrs_at(self, step):
        lrs = self.schedulers[0].lrs_at(step)
        for milestone, scheduler in zip(self.milestones, self.schedulers[1:]):
            later = scheduler.lrs_at(step - milestone)
            lrs = [torch.where(step >= milestone, b, a) for a, b in zip(lrs, later)]
        return lrs
