"""Dice losses for segmentation: the Dice coefficient per class, and its mix with
cross-entropy."""
import torch

__all__ = ["DiceLoss", "DiceCELoss"]


class DiceLoss:
    """The Dice coefficient of each sample and class, ``(2 * |X & Y| + smooth_nr) /
    (|X| + |Y| + smooth_dr)``, summed over the spatial positions, where X are the
    predicted class probabilities and Y the one-hot labels.

    A plain callable, not a module: ``dice(outputs, labels, input_shape)`` with `outputs`
    of shape ``(N, C, *spatial)`` (= `input_shape`, the shape the one-hot tensors take)
    returns a tensor of shape ``(N, C)``. With `include_background` False the background
    class (class 0) is left out of both sides, so its coefficient is 0.

    Args:
        num_classes: the number of classes C.
        to_onehot_y: the labels are class ids, shape ``(N, *spatial)`` or
            ``(N, 1, *spatial)``, to be turned into one-hot channels; otherwise they are
            already of shape `input_shape`.
        to_onehot_x: turn the predictions into one-hot channels (after `use_argmax`).
        use_softmax: take the softmax of `outputs` over the channels first.
        use_argmax: take the class with the highest output instead (when not
            `use_softmax`); needs `to_onehot_x`.
        include_background: whether class 0 is scored.
    """

    def __init__(self, num_classes, to_onehot_y=True, to_onehot_x=False, use_softmax=True,
                 use_argmax=False, include_background=False):
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) \
                or num_classes < 1:
            raise ValueError(f"DiceLoss needs num_classes, a positive int; got "
                             f"{num_classes!r}")
        if not include_background and num_classes < 2:
            raise ValueError("DiceLoss: without the background class, num_classes must be "
                             f"at least 2; got {num_classes}")
        if use_argmax and not use_softmax and not to_onehot_x:
            raise ValueError("DiceLoss(use_argmax=True) gives class ids; it needs "
                             "to_onehot_x=True to score them per class")
        self.num_classes = num_classes
        self.include_background = include_background
        self.to_onehot_y = to_onehot_y
        self.to_onehot_x = to_onehot_x
        self.use_softmax = use_softmax
        self.use_argmax = use_argmax
        self.smooth_nr = 0.0
        self.smooth_dr = 1e-6
        self.bg_mask = None

    def _one_hot(self, ids: torch.Tensor, shape, dtype) -> torch.Tensor:
        if ids.dim() == len(shape):
            ids = ids.squeeze(1)
        classes = torch.arange(self.num_classes, device=ids.device).reshape(
            (1, self.num_classes) + (1,) * (len(shape) - 2))
        return (ids.unsqueeze(1).long() == classes).to(dtype)

    def __call__(self, outputs: torch.Tensor, labels: torch.Tensor, input_shape):
        shape = tuple(input_shape)
        if tuple(outputs.shape) != shape or len(shape) < 2 or shape[1] != self.num_classes:
            raise ValueError(f"DiceLoss: outputs of shape {tuple(outputs.shape)} do not "
                             f"match input_shape {shape} (N, num_classes={self.num_classes}"
                             ", *spatial)")
        dtype = outputs.dtype
        if self.use_softmax:
            predictions = torch.softmax(outputs, dim=1)
        elif self.use_argmax:
            predictions = torch.argmax(outputs, dim=1)
        else:
            predictions = outputs
        if self.to_onehot_x:
            predictions = self._one_hot(predictions, shape, dtype)
        target = self._one_hot(labels, shape, dtype) if self.to_onehot_y else labels.to(dtype)
        if tuple(target.shape) != shape:
            raise ValueError(f"DiceLoss: labels of shape {tuple(labels.shape)} do not give "
                             f"one-hot targets of shape {shape}")
        if not self.include_background:
            keep = (torch.arange(self.num_classes, device=outputs.device) > 0).to(dtype)
            keep = keep.reshape((1, self.num_classes) + (1,) * (len(shape) - 2))
            predictions, target = predictions * keep, target * keep
        axes = list(range(2, len(shape)))
        intersection = (target * predictions).sum(axes)
        total = target.sum(axes) + predictions.sum(axes)
        return (2.0 * intersection + self.smooth_nr) / (total + self.smooth_dr)


class DiceCELoss(torch.nn.Module):
    """``wc * cross_entropy + wd * (1 - mean Dice coefficient)`` of segmentation
    `outputs` (logits, shape ``(N, C, *spatial)``) against `labels` (class ids, shape
    ``(N, *spatial)`` or ``(N, 1, *spatial)``). The Dice term is `DiceLoss` with softmax
    and one-hot labels; without the background class its mean is taken over the other
    classes only (the mean over all, times ``C / (C - 1)``).

    Args:
        num_classes: the number of classes C.
        include_background: whether class 0 counts in the Dice term.
        wc: the weight of the cross-entropy.
        wd: the weight of the Dice term.
    """

    def __init__(self, num_classes, include_background, wc=0.5, wd=0.5):
        super().__init__()
        self.dice = DiceLoss(num_classes, include_background=include_background)
        self.wc = wc
        self.wd = wd
        scored = num_classes if include_background else num_classes - 1
        self.mean_correction = torch.tensor(num_classes / scored, dtype=torch.float32)
        self.one_const = torch.tensor(1.0, dtype=torch.float32)

    def forward(self, outputs, labels, input_shape):
        ids = labels.squeeze(1) if labels.dim() == outputs.dim() else labels
        cross_entropy = torch.nn.functional.cross_entropy(outputs, ids.long())
        dice = self.dice(outputs, labels, input_shape)
        dice_loss = self.one_const - self.mean_correction * dice.mean()
        return self.wc * cross_entropy + self.wd * dice_loss
