"""`cerebras.pytorch.utils.data.compute_num_steps`: how many steps a run takes."""

__all__ = ["compute_num_steps"]


def _check(name, value, minimum=1):
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                              or value < minimum):
        raise ValueError(f"{name} must be None or an int >= {minimum}, got {value!r}")


def compute_num_steps(dataloader, initial_step: int = 0, num_steps: int | None = None,
                      max_steps: int | None = None, num_epochs: int | None = None,
                      steps_per_epoch: int | None = None, grad_accum_steps: int = 1) -> int:
    """The number of steps to run over `dataloader` (a `cstorch.utils.data.DataLoader`
    or anything with a length, needed only when an epoch's length is), counted in
    optimizer steps.

    - `num_steps`: exactly that many (it takes precedence over `max_steps`);
    - `max_steps`: up to that step counted from the start of training, so
      ``max_steps - initial_step`` when the run resumes at step `initial_step`;
    - `num_epochs` (exclusive with `num_steps`): that many epochs of `steps_per_epoch`
      steps each (by default the dataloader's length), bounded by `max_steps` if given;
    - none of them: one epoch (`steps_per_epoch` or the dataloader's length).

    With gradient accumulation (`grad_accum_steps` batches per optimizer step, CPU and
    GPU runs), an epoch is ``steps_per_epoch // grad_accum_steps`` optimizer steps.
    Raises a ValueError when the result is not a positive number of steps.
    """
    _check("num_steps", num_steps)
    _check("max_steps", max_steps)
    _check("num_epochs", num_epochs)
    _check("steps_per_epoch", steps_per_epoch)
    _check("grad_accum_steps", grad_accum_steps)
    _check("initial_step", initial_step, minimum=0)
    if num_steps is not None and num_epochs is not None:
        raise ValueError("num_steps and num_epochs are mutually exclusive; give one of them")

    def epoch_steps() -> int:
        length = None
        try:
            length = len(dataloader)
        except TypeError:
            pass
        if steps_per_epoch is not None:
            if length is not None and steps_per_epoch > length:
                raise ValueError(f"steps_per_epoch ({steps_per_epoch}) exceeds the number of "
                                 f"batches in an epoch of the dataloader ({length})")
            batches = steps_per_epoch
        elif length is None:
            raise ValueError("the dataloader has no length, so an epoch's number of steps is "
                             "unknown: give num_steps, max_steps or steps_per_epoch")
        else:
            batches = length
        steps = batches // grad_accum_steps
        if steps < 1:
            raise ValueError(f"an epoch of {batches} batches makes no optimizer step with "
                             f"grad_accum_steps={grad_accum_steps}")
        return steps

    if num_steps is not None:
        total = num_steps
    elif num_epochs is not None:
        total = num_epochs * epoch_steps()
        if max_steps is not None:
            total = min(total, max_steps - initial_step)
    elif max_steps is not None:
        total = max_steps - initial_step
    else:
        total = epoch_steps()
    if total < 1:
        raise ValueError(f"no steps to run: the run is at step {initial_step} and max_steps is "
                         f"{max_steps}" if max_steps is not None and num_steps is None
                         else f"no steps to run (computed {total})")
    return total
