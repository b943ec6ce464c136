"""`cstorch.utils.data.DataLoader`: a dataloader built from an input function."""
from typing import Any, Callable


class DataLoader:
    """Wraps ``input_fn(*args, **kwargs)``, which returns a `torch.utils.data.DataLoader`
    or any iterable of (structures of) tensors. Each iteration goes over a fresh pass of it.
    """

    def __init__(self, input_fn: Callable, *args, **kwargs):
        if not callable(input_fn):
            raise TypeError(
                f"DataLoader expects an input function that returns a dataloader, got "
                f"{type(input_fn).__name__}; wrap it: DataLoader(lambda: my_loader)")
        self.input_fn = input_fn
        self.input_args = args
        self.input_kwargs = kwargs
        self._loader = None

    @property
    def dataloader(self):
        if self._loader is None:
            self._loader = self.input_fn(*self.input_args, **self.input_kwargs)
            try:
                iter(self._loader)
            except TypeError:
                raise TypeError(f"input_fn must return an iterable, it returned "
                                f"{type(self._loader).__name__}") from None
        return self._loader

    def __iter__(self):
        return iter(self.dataloader)

    def __len__(self):
        return len(self.dataloader)

    def state_dict(self) -> dict[str, Any]:
        loader = self.dataloader
        return loader.state_dict() if hasattr(loader, "state_dict") else {}

    def load_state_dict(self, state_dict: dict[str, Any], strict: bool = True):
        loader = self.dataloader
        if hasattr(loader, "load_state_dict"):
            loader.load_state_dict(state_dict)
        elif state_dict and strict:
            raise RuntimeError("the dataloader has no load_state_dict to restore this state into")
