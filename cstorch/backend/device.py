"""`backend.device`: the context a model is built in."""
from cstorch.backends import csx
from cstorch.lazy_init import LazyMode


class Device:
    """`backend.device`: the backend's device, printable ("CSX", "CPU", "GPU") and a
    context manager to build a model in.

    On a CSX backend with `cstorch.backends.csx.debug.lazy_initialization` (default True,
    read when the context is entered), tensors created inside it are lazy
    (`LazyInitTensor`): no host memory, built on the devices by `cstorch.compile`. On CPU
    and GPU backends, or with the flag False, tensors are created eagerly by PyTorch, with
    eager PyTorch's values. Entering it again while inside is allowed and changes nothing.
    """

    def __init__(self, backend):
        self._backend = backend
        self._mode = None
        self._depth = 0

    @property
    def type(self) -> str:
        return str(self._backend.backend_type)

    @property
    def lazy_initialization(self) -> bool:
        """Whether entering this context now makes created tensors lazy."""
        return self._backend.is_csx and csx.debug.lazy_initialization

    def __str__(self):
        return self.type

    def __repr__(self):
        return f"device(type={self.type!r})"

    def __enter__(self):
        if self._depth == 0 and self.lazy_initialization:
            self._mode = LazyMode(self._backend)
            self._mode.__enter__()
        self._depth += 1
        return self

    def __exit__(self, *exc):
        self._depth -= 1
        if self._depth == 0 and self._mode is not None:
            mode, self._mode = self._mode, None
            mode.__exit__(*exc)
        return False
