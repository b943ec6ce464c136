"""The reference's `cstorch.distributed` names beyond Model Zoo's: roles, receivers,
`WorkerState`, `BaseServiceResolver`, `get_dir_size`, `is_master_ordinal(local=)` and
`get_streaming_batch_size(global_rank=)`."""
import pytest
import torch

import cerebras.pytorch as cstorch
from cstorch.distributed import process_group
from cstorch.utils.data.workers import DataLoaderCheckpoint


def test_outside_a_worker(tmp_path):
    dist = cstorch.distributed
    assert {r.name for r in dist.TaskRole} == {"STREAMER", "RECEIVER"}
    assert dist.is_receiver() is False and dist.num_receivers() == 0
    (tmp_path / "sub").mkdir()
    (tmp_path / "a").write_bytes(b"x" * 100)
    (tmp_path / "sub" / "b").write_bytes(b"y" * 28)
    assert dist.get_dir_size(str(tmp_path)) == 128 and dist.get_dir_size(tmp_path / "a") == 100
    assert dist.get_streaming_batch_size(12) == 12 == dist.get_streaming_batch_size(12, 0)
    with pytest.raises(ValueError, match="global_rank"):
        dist.get_streaming_batch_size(12, 1)
    with pytest.raises(RuntimeError, match="not a streaming worker"):
        dist.BaseServiceResolver.get_resolver()
    with pytest.raises(RuntimeError, match="state_dict"):
        dist.WorkerState.get_worker_state()
    import cerebras.pytorch.distributed.worker_state as module
    assert module.WorkerState is dist.WorkerState


def test_worker_state_configured():
    dist = cstorch.distributed
    state = DataLoaderCheckpoint(global_worker_id=1, local_worker_id=1, total_num_workers=2,
                                 num_workers_per_csx=2, num_csx=1, wse_id=0, appliance_step=4,
                                 worker_step=2, samples_streamed=8)
    try:
        dist.WorkerState.configure(state)
        assert dist.get_worker_state() is state and dist.WorkerState.get_worker_state() is state
        with pytest.raises(TypeError, match="DataLoaderCheckpoint"):
            dist.WorkerState.configure({"samples_streamed": 8})
    finally:
        dist.WorkerState.configure(None)


def test_local_master_ordinal(monkeypatch):
    dist = cstorch.distributed
    assert dist.is_master_ordinal(local=True)
    # rank 5 of 8, main process 0, second on its node
    monkeypatch.setattr(process_group, "_group", process_group.ProcessGroup(5, 8, 1, 0, "cpu"))
    assert not dist.is_master_ordinal() and not dist.is_master_ordinal(local=True)
    monkeypatch.setattr(process_group, "_group", process_group.ProcessGroup(4, 8, 0, 0, "cpu"))
    assert not dist.is_master_ordinal() and dist.is_master_ordinal(local=True)


def test_service_resolver_inside_workers(tmp_path):
    config = cstorch.distributed.ClusterConfig(num_workers_per_csx=2)
    cstorch.backend("CSX", artifact_dir=str(tmp_path), cluster_config=config)
    seen = []

    def input_fn():
        dist = cstorch.distributed
        resolver = dist.BaseServiceResolver.get_resolver()
        seen.append((resolver.cluster_spec.rank, resolver.streamer_ordinals(),
                     resolver.receiver_ordinals(), resolver.cluster_resolver is resolver,
                     isinstance(dist.service_resolver(), dist.BaseServiceResolver),
                     dist.get_streaming_batch_size(8, 1)))
        return [torch.ones(2)] * 3

    assert len(cstorch.utils.data.DataLoader(input_fn).workers()) == 2
    assert seen == [(0, [0, 1], [], True, True, 8), (1, [0, 1], [], True, True, 8)]
