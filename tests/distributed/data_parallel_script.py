"""Run by torchrun (two processes) in tests/distributed/test_torchrun.py: train a small
model data-parallel on the GPU backend over CPU devices (dist_backend="gloo") and write
what every process saw. Without sync_batchnorm, the same model is also trained by
torch's own DistributedDataParallel on each process's shard, the peer to compare with."""
import copy
import importlib
import json
import os
import sys

import torch
import torch.distributed as dist

import cerebras.pytorch as cstorch

sys.path.insert(0, os.path.dirname(__file__))
from models import (LR, MOMENTUM, global_batches, make_model, shard,  # noqa: E402
                    train_cstorch)


def torch_ddp(model, kind, rank, world):
    """DistributedDataParallel over the gloo group the backend set up: loss averaged over
    processes, parameters and buffers afterwards."""
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=LR, momentum=MOMENTUM)
    losses = []
    for x, y in global_batches(kind):
        loss = torch.nn.functional.cross_entropy(ddp(shard(x, rank, world)), shard(y, rank, world))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(float(mean) / world)
    return losses, {k: v.tolist() for k, v in model.state_dict().items()}


# Three runs in each process, each on a backend of its own: each replaces the last, as in
# the test suite (a user's second backend is refused).
importlib.import_module("cstorch.backend")._replacing_allowed = True


def train(kind: str, sync_batchnorm: bool, rank_dir: str, rank: int, init_method: str):
    backend = cstorch.backend("GPU", enable_distributed=True, dist_backend="gloo",
                              sync_batchnorm=sync_batchnorm, init_method=init_method,
                              artifact_dir=os.path.join(rank_dir, "artifacts"))
    world = backend.process_group.world_size
    torch.manual_seed(0)
    model = make_model(kind)
    reference = copy.deepcopy(model)
    # Each process starts from other weights: the main process's must win.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(rank)
    losses = train_cstorch(model, backend, kind, rank, world)
    result = {"losses": losses, "state": {k: v.tolist() for k, v in model.state_dict().items()},
              "world": world, "devices": len(backend.devices)}
    if not sync_batchnorm:
        result["ddp_losses"], result["ddp_state"] = torch_ddp(reference, kind, rank, world)
    return result, model


def main(out_dir: str):
    rank = int(os.environ["RANK"])
    # Not torchrun's env:// default: the processes meet through a file, as
    # torch.distributed.init_process_group(init_method="file://...") does.
    init_method = "file://" + os.path.join(out_dir, "rendezvous")
    rank_dir = os.path.join(out_dir, f"rank{rank}")
    os.makedirs(rank_dir)
    results = {}
    for kind, sync in (("mlp", False), ("bn", False), ("bn", True)):
        results[f"{kind}-{'sync' if sync else 'local'}"], model = train(
            kind, sync, rank_dir, rank, init_method)
    # Files: only the main process writes; each process names its own paths here, so a
    # file written by another process would show.
    cstorch.save({"model": model.state_dict()}, os.path.join(rank_dir, "checkpoint.mdl"))
    writer = cstorch.utils.tensorboard.SummaryWriter(os.path.join(rank_dir, "events"))
    writer.add_scalar("loss", results["bn-sync"]["losses"][-1], 1)
    writer.close()
    dist.barrier()
    # Every process can read the main process's checkpoint.
    loaded = cstorch.load(os.path.join(out_dir, "rank0", "checkpoint.mdl"))
    results["loaded"] = {k: v.tolist() for k, v in loaded["model"].items()}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(sys.argv[1])
