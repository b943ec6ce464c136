"""`cerebras.pytorch.utils.data`: dataloaders and the executor that runs them."""
from cstorch.utils.data import data_executor, sampler
from cstorch.utils.data.dataloader import DataLoader, RestartableDataLoader
from cstorch.utils.data.dataset import SyntheticDataset
from cstorch.utils.data.executor import DataExecutor, current_executor
from cstorch.utils.data.sampler import DistributedSampler
from cstorch.utils.data.steps import compute_num_steps
from cstorch.utils.data.utils import Schedule, infer_batch_size
from cstorch.utils.data.workers import DataLoaderCheckpoint

__all__ = ["DataLoader", "DataExecutor", "current_executor", "SyntheticDataset",
           "RestartableDataLoader", "DataLoaderCheckpoint", "Schedule", "infer_batch_size",
           "DistributedSampler", "compute_num_steps", "sampler", "data_executor"]
