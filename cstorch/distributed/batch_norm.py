"""Batch normalisation per process in a multi-process run without `sync_batchnorm`.

A step is one program over the global batch, so batch statistics would naturally be the
global batch's, which is what `torch.nn.SyncBatchNorm` computes (`sync_batchnorm=True`).
Without it, DistributedDataParallel normalises each process's shard by that shard's own
statistics, and its running statistics are those of process 0 (DDP broadcasts rank 0's
buffers before every forward pass). While such a step is captured, `F.batch_norm` in
training mode is replaced by that computation on the global batch viewed as
(processes, shard, ...).
"""
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode


def _per_shard(x, running_mean, running_var, weight, bias, momentum, eps, shards: int):
    if x.shape[0] % shards:
        raise ValueError(f"a batch of {x.shape[0]} does not split into {shards} process shards")
    xs = x.reshape(shards, x.shape[0] // shards, *x.shape[1:])
    dims = [1] + list(range(3, xs.dim()))
    mean = xs.mean(dims, keepdim=True)
    var = xs.var(dims, unbiased=False, keepdim=True)
    y = ((xs - mean) * torch.rsqrt(var + eps)).reshape(x.shape)
    channel = [1, -1] + [1] * (x.dim() - 2)
    if weight is not None:
        y = y * weight.reshape(channel)
    if bias is not None:
        y = y + bias.reshape(channel)
    if running_mean is not None and momentum:
        count = xs[0].numel() // x.shape[1]   # values per channel in one shard
        with torch.no_grad():
            first_mean = mean[0].reshape(-1)
            first_var = var[0].reshape(-1) * (count / max(count - 1, 1))
            running_mean.mul_(1 - momentum).add_(first_mean * momentum)
            running_var.mul_(1 - momentum).add_(first_var * momentum)
    return y


class PerProcessBatchNorm(TorchFunctionMode):
    """Inside it, training-mode `F.batch_norm` uses per-process-shard statistics."""

    def __init__(self, shards: int):
        super().__init__()
        self.shards = shards

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.batch_norm:
            names = ("input", "running_mean", "running_var", "weight", "bias", "training",
                     "momentum", "eps")
            bound = {"weight": None, "bias": None, "training": False, "momentum": 0.1,
                     "eps": 1e-5, **dict(zip(names, args)), **kwargs}
            if bound["training"]:
                return _per_shard(bound["input"], bound["running_mean"], bound["running_var"],
                                  bound["weight"], bound["bias"], bound["momentum"],
                                  bound["eps"], self.shards)
        return func(*args, **kwargs)
