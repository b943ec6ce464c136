"""Batch normalisation with `momentum=None` (a cumulative moving average) in a captured step.

Eager PyTorch computes that average's factor on the host, `1 / float(num_batches_tracked)`,
which reads the counter's value; in a captured step the counter is a traced tensor. While
a step is captured, such a module in training mode computes the same update with the
factor as a tensor: the batch is normalised by its own statistics, and the running mean
and variance move by `1 / num_batches_tracked` towards the batch's mean and unbiased
variance, as torch's kernel does.
"""
import contextlib

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

_EAGER_FORWARD = _BatchNorm.forward


def _forward(self, input):
    if not (self.momentum is None and self.training and self.track_running_stats):
        return _EAGER_FORWARD(self, input)
    self._check_input_dim(input)
    self.num_batches_tracked.add_(1)
    factor = 1.0 / self.num_batches_tracked.to(input.dtype)
    out = F.batch_norm(input, None, None, self.weight, self.bias, True, 0.0, self.eps)
    dims = [0] + list(range(2, input.dim()))
    count = input.numel() // input.shape[1]
    with torch.no_grad():
        mean = input.mean(dims)
        var = input.var(dims, unbiased=count > 1)
        self.running_mean.copy_(self.running_mean * (1 - factor) + mean * factor)
        self.running_var.copy_(self.running_var * (1 - factor) + var * factor)
    return out


@contextlib.contextmanager
def cumulative_batch_norm():
    """Inside it, batch norm modules with `momentum=None` train with a traced factor."""
    _BatchNorm.forward = _forward
    try:
        yield
    finally:
        _BatchNorm.forward = _EAGER_FORWARD
