"""`LRScheduler`: the base of cstorch's learning-rate schedules.

A schedule is a closed-form function of a step counter. The counter is a tensor kept in
the optimizer's ``schedule_state`` (device state, bound into a traced step like the
optimizer's own state) and the rate is written as a tensor ``lr`` into each param group it
drives, so `scheduler.step()` inside `@cstorch.trace` advances the schedule on the device
without a new capture, and eagerly it does the same with ordinary tensors.
"""
import math

import torch


class LRScheduler:
    """Base class: subclasses implement `lr_at(step)`, the rate after `step` calls of
    `step()`, as torch ops on the float32 tensor `step`.

    ``param_group_tags`` (a tag or a collection of tags) limits the schedule to the param
    groups whose ``"tags"`` entry shares one of them; ``None`` drives every group. Right
    after construction each driven group's ``lr`` is the rate at step 0.
    """

    def __init__(self, optimizer, total_iters=None, last_epoch=-1, param_group_tags=None):
        from cstorch.optim.optimizer import Optimizer
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(self).__name__} needs a cstorch.optim optimizer, "
                            f"got {type(optimizer).__name__}")
        self.optimizer = optimizer
        self.total_iters = total_iters
        self.param_group_tags = param_group_tags
        self._groups = self._select_groups(param_group_tags)
        self.base_lrs = [float(optimizer.param_groups[g]["lr"]) for g in self._groups]
        n = sum(1 for k in optimizer.schedule_state if k.startswith("lr_scheduler"))
        self._key = f"lr_scheduler{n}.last_epoch"
        optimizer.schedule_state[self._key] = torch.tensor(float(last_epoch + 1))
        self._write_lr()

    def _select_groups(self, tags):
        groups = range(len(self.optimizer.param_groups))
        if tags is None:
            return list(groups)
        tags = {tags} if isinstance(tags, str) else set(tags)
        chosen = []
        for g in groups:
            group_tags = self.optimizer.param_groups[g].get("tags", set())
            group_tags = {group_tags} if isinstance(group_tags, str) else set(group_tags)
            if group_tags & tags:
                chosen.append(g)
        if not chosen:
            raise ValueError(f"no param group of the optimizer has any of the tags {sorted(tags)}")
        return chosen

    # the counter ------------------------------------------------------------------------
    @property
    def _step_tensor(self):
        self.optimizer.state  # noqa: B018  (brings device values to the host when eager)
        return self.optimizer.schedule_state[self._key]

    @property
    def last_epoch(self) -> int:
        """How many times `step()` has run (the step the current rate belongs to)."""
        return int(self._step_tensor.item())

    # the schedule -----------------------------------------------------------------------
    def lr_at(self, step: torch.Tensor) -> torch.Tensor:
        """The rate at `step` (a float32 tensor), as a tensor."""
        raise NotImplementedError

    def lrs_at(self, step):
        """One rate per driven param group; the same for all unless a schedule scales
        each group's own base rate."""
        lr = self.lr_at(step)
        return [lr] * len(self._groups)

    def _write_lr(self):
        step = self._step_tensor
        with torch.no_grad():
            for g, lr in zip(self._groups, self.lrs_at(step)):
                group = self.optimizer.param_groups[g]
                lr = torch.as_tensor(lr, dtype=torch.float32)
                if isinstance(group["lr"], torch.Tensor):
                    # In place: the tensor is a device-state slot (and a traced value
                    # inside a capture) and must keep its identity.
                    group["lr"].copy_(lr)
                else:
                    group["lr"] = lr.clone()

    def step(self, *args, **kwargs):
        """Advance the schedule by one step and write the new rate into the param groups."""
        with torch.no_grad():
            self._step_tensor.add_(1)
        self._write_lr()

    def get_last_lr(self):
        """The rates last written, one per driven param group, as Python floats."""
        self.optimizer.state  # noqa: B018
        return [float(self.optimizer.param_groups[g]["lr"]) for g in self._groups]

    def get_lr(self):
        return self.get_last_lr()

    # checkpoints ------------------------------------------------------------------------
    def state_dict(self):
        """The position in the schedule (and the base rates); hyperparameters come from
        the constructor, as with torch's schedulers."""
        return {"last_epoch": self.last_epoch, "base_lrs": list(self.base_lrs)}

    def load_state_dict(self, state_dict):
        """Resume at the saved position: the counter and the rate it implies."""
        self.base_lrs = list(state_dict.get("base_lrs", self.base_lrs))
        with torch.no_grad():
            self._step_tensor.fill_(float(state_dict["last_epoch"]))
        self._write_lr()


def clamp_steps(step, total_iters):
    return torch.clamp(step, max=float(total_iters))


def cosine(progress):
    """``(1 + cos(pi * progress)) / 2``."""
    return (1 + torch.cos(math.pi * progress)) / 2
