"""`CyclicLR`: cyclical learning rates (Smith, 2017)."""
import torch

from cstorch.optim.lr_scheduler.scheduler import LRScheduler


class CyclicLR(LRScheduler):
    """Between ``base_lr`` and ``max_lr``: up over ``step_size_up`` steps, down over
    ``step_size_down`` (default: the same). ``mode`` scales the amplitude: "triangular"
    (constant), "triangular2" (halved every cycle), "exp_range" (``gamma ** t``);
    ``scale_mode`` says whether the scale follows the cycle number or the step."""

    def __init__(self, optimizer: torch.optim.Optimizer,
                 base_lr, max_lr, step_size_up=2000, step_size_down=None,
                 mode="triangular", gamma=1.0, scale_mode="cycle", param_group_tags=None):
        if mode not in ("triangular", "triangular2", "exp_range"):
            raise ValueError(f"mode must be triangular, triangular2 or exp_range, got {mode!r}")
        self.base_lr, self.max_lr = base_lr, max_lr
        self.step_size_up = float(step_size_up)
        self.step_size_down = float(step_size_down) if step_size_down is not None else self.step_size_up
        self.mode, self.gamma = mode, gamma
        self.scale_mode = "iterations" if mode == "exp_range" else scale_mode
        super().__init__(optimizer, None, param_group_tags=param_group_tags)

    def lr_at(self, step):
        total = self.step_size_up + self.step_size_down
        ratio = self.step_size_up / total
        cycle = torch.floor(1 + step / total)
        x = 1 + step / total - cycle
        factor = torch.where(x <= ratio, x / ratio, (x - 1) / (ratio - 1))
        x_scale = cycle if self.scale_mode == "cycle" else step
        if self.mode == "triangular":
            scale = torch.ones_like(step)
        elif self.mode == "triangular2":
            scale = 1 / torch.pow(2.0, x_scale - 1)
        else:
            scale = torch.pow(self.gamma, x_scale)
        return self.base_lr + (self.max_lr - self.base_lr) * factor * scale
