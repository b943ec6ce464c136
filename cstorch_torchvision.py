"""torchvision imports beside a CPU-only torch whose build its C++ operators do not match.

PyPI's torchvision wheels for Linux are built against torch's CUDA build: their operator
library (`torchvision/_C`) links torch's CUDA libraries, which a CPU-only torch does not
have. torchvision expects that library to be optional (its transforms, datasets and models
are Python; its operators raise "Couldn't load custom C++ ops" when called), but since
0.18 its import registers fake kernels for `torchvision::nms` and `torchvision::qnms`
unconditionally, and torch refuses a fake kernel for an operator that was never declared:
the whole import fails. Model Zoo imports torchvision from its data and trainer modules, so
no `cszoo fit` could start.

`declare_missing_torchvision_operators` watches for torchvision's first import. Where the
operator library does not load, it declares the two operators' schemas (no kernels), and
torchvision imports with its operators unavailable, which a warning says; calling one
still raises torchvision's own error. Where the library loads, or torchvision is not
installed, nothing is changed.

This module runs when torch is imported, before torchvision's own code, as a plugin of
torch's (an entry point in the `torch.backends` group, which `import torch` loads), so the
order of a user's imports does not matter (`transformers` imports torchvision from every
model module). It imports nothing but torch; `cstorch` calls it again when imported, for
an environment that switched torch's plugins off (`TORCH_DEVICE_BACKEND_AUTOLOAD=0`).
"""
import importlib.abc
import importlib.machinery
import os
import sys
import warnings

# torchvision's own schemas for the operators it registers fake kernels for at import.
_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
_declared = []  # the Library object must live as long as the process


def _operator_library(package_dir):
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = os.path.join(package_dir, "_C" + suffix)
        if os.path.exists(path):
            return path
    return None


def _declare_if_unloadable(package_dir):
    # torch loads this module while torch itself is being imported: no import of it above
    import torch  # noqa: PLC0415 (see the comment above)

    path = _operator_library(package_dir)
    if path is None:
        return
    try:
        torch.ops.load_library(path)
        return
    except OSError as error:
        reason = str(error)
    library = torch.library.Library("torchvision", "FRAGMENT")
    for schema in _SCHEMAS:
        library.define(schema)
    _declared.append(library)
    warnings.warn(f"torchvision's C++ operators do not load with this torch "
                  f"({torch.__version__}): {reason}. Its transforms, datasets and models "
                  f"work; its operators (torchvision.ops.nms, roi_align, ...) raise when "
                  f"called. Install the torchvision build made for this torch to have them.",
                  stacklevel=2)


class _FirstImportWatch(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torchvision":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.submodule_search_locations:
            _declare_if_unloadable(spec.submodule_search_locations[0])
        return None  # the regular finders import it


def declare_missing_torchvision_operators():
    """Let `import torchvision` succeed where its operator library cannot load: now, where
    torchvision is being imported (it imports torch first), or at its first import."""
    module = sys.modules.get("torchvision")
    if module is not None:
        if not _declared and not hasattr(module, "__version__"):   # its import has begun
            _declare_if_unloadable(list(module.__path__)[0])
        return
    if not any(isinstance(finder, _FirstImportWatch) for finder in sys.meta_path):
        sys.meta_path.insert(0, _FirstImportWatch())
