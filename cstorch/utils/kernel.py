"""`cerebras.pytorch.utils.kernel`: choosing a compiler kernel for an op."""
from dataclasses import dataclass
from collections.abc import Callable

from cstorch.core.annotation import AnnotationMode, create_annotation

__all__ = ["kernel_annotater", "KernelConfig"]


@dataclass
class KernelConfig(AnnotationMode.Config):
    """Which kernel the Cerebras compiler should use for the annotated ops."""
    kernel: str


def _kernel_attribute(config: KernelConfig, is_backward: bool):
    return AnnotationMode.Attribute("kernel", config.kernel)


def kernel_annotater(kernel: str | None) -> Callable[[Callable], Callable]:
    """A decorator that asks for kernel `kernel` (a name such as ``"FLASH"``) for the ops
    of the function it wraps, forward and backward::

        using_kernel = kernel_annotater("FLASH")
        out = using_kernel(torch.matmul)(scores, v)

    The request is an annotation (`cstorch.core.annotation`): recorded as the attribute
    ``kernel`` on the ops traced in the call, with no effect on what they compute (XLA
    picks its own kernels). `kernel=None` gives a decorator that returns the function
    unchanged.
    """
    if kernel is None:
        return lambda fn: fn
    if not isinstance(kernel, str):
        raise TypeError(f"kernel_annotater expects a kernel name or None, got {kernel!r}")
    return create_annotation(KernelConfig, _kernel_attribute, kernel=kernel,
                             enable_fwd=True, enable_bwd=True)
