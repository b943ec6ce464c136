"""The half dtype and the mixed-precision switch: which 16-bit floating point format a run
uses, and whether it uses one at all.

These are process-wide settings, as in the reference API: Model Zoo sets them while
building its trainer, before any backend exists, so they cannot live on the backend.
"""
import torch

# cbfloat16 (the wafer's own 16-bit format) has no torch dtype: as in the reference,
# tensors of it are torch.float16, and only the name tells the two apart.
_HALF = {"float16": torch.float16, "bfloat16": torch.bfloat16, "cbfloat16": torch.float16}
_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16"}

_settings = {"half": "float16", "mixed_precision": False}


def set_half_dtype(value) -> torch.dtype:
    """Choose the 16-bit floating point format, "float16", "bfloat16" or "cbfloat16" (or
    `torch.float16` / `torch.bfloat16`), and switch mixed precision on. Returns the torch
    dtype tensors of that format have (torch.float16 for cbfloat16).

    cbfloat16 is the Cerebras wafer's own 16-bit format: no tensor here is stored in it,
    choosing it is recorded (`get_half_dtype_str()` says "cbfloat16", so code that branches
    on it behaves as on a wafer) and tensors use torch.float16 in its place.
    """
    if isinstance(value, torch.dtype):
        name = _NAMES.get(value)
    else:
        name = value if isinstance(value, str) and value in _HALF else None
    if name is None:
        raise ValueError(f"Invalid half dtype: {value}. Accepted values are: \"float16\", "
                         f"\"bfloat16\", \"cbfloat16\", torch.float16, torch.bfloat16.")
    _settings["half"] = name
    _settings["mixed_precision"] = True
    return _HALF[name]


def get_half_dtype() -> torch.dtype:
    """The torch dtype of the chosen 16-bit format (torch.float16 unless `set_half_dtype`
    chose another; torch.float16 stands in for cbfloat16)."""
    return _HALF[_settings["half"]]


def get_half_dtype_str() -> str:
    """The chosen 16-bit format's name: "float16", "bfloat16" or "cbfloat16"."""
    return _settings["half"]


def enable_mixed_precision(enabled: bool = True) -> bool:
    """Switch mixed precision on (or off with `enabled=False`): the floating point dtype
    of the run becomes the half dtype instead of float32. Returns `enabled`."""
    if not isinstance(enabled, bool):
        raise ValueError(f"Expected a boolean value, got: {type(enabled)}")
    _settings["mixed_precision"] = enabled
    return enabled


def init():
    """Start mixed precision for the run (the reference's apex-style entry point): switch
    it on with the current half dtype (float16 unless `set_half_dtype` chose another).
    Loss scaling and `cstorch.amp.optimizer_step` work with or without this call."""
    enable_mixed_precision(True)


def mixed_precision() -> bool:
    """Whether mixed precision is switched on (off by default)."""
    return _settings["mixed_precision"]


def get_floating_point_dtype(default: torch.dtype = torch.float32) -> torch.dtype:
    """The floating point dtype of the run: the half dtype under mixed precision,
    `default` (torch.float32) otherwise. Data pipelines cast their float inputs to it."""
    return get_half_dtype() if mixed_precision() else default


def get_floating_point_dtype_str() -> str:
    """The name of `get_floating_point_dtype()`: "float32", or the half dtype's name
    ("cbfloat16" included) under mixed precision."""
    return get_half_dtype_str() if mixed_precision() else "float32"


def is_cbfloat16_tensor(tensor) -> bool:
    """Whether `tensor` is stored in cbfloat16. Always False here: cbfloat16 exists only on
    a wafer, and tensors here use torch.float16 in its place (see `set_half_dtype`), so
    code that casts cbfloat16 tensors back to float32 has nothing to do."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"is_cbfloat16_tensor expects a torch.Tensor, got "
                        f"{type(tensor).__name__}")
    return False
