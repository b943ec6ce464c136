"""`cerebras.pytorch.utils.data`: dataloaders and the executor that runs them."""
from cstorch.utils.data.dataloader import DataLoader
from cstorch.utils.data.executor import DataExecutor, current_executor

__all__ = ["DataLoader", "DataExecutor", "current_executor"]
