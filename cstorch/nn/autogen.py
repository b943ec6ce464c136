"""The `use_autogen` flag every `cerebras.pytorch.nn` loss but the Dice ones takes.

On a Cerebras system it asks the compiler to generate a kernel for the loss instead of
lowering it op by op; the values are the same either way. Here every loss is lowered op
by op, so the flag is kept (as `autogen_enabled`) but changes nothing, and setting it
says so.
"""
import warnings


def take_use_autogen(owner: str, kwargs: dict) -> bool:
    """Remove `use_autogen` from a loss's keyword arguments and return it, warning when
    it is set."""
    use_autogen = bool(kwargs.pop("use_autogen", False))
    if use_autogen:
        warnings.warn(f"{owner}(use_autogen=True): kernel autogeneration is a Cerebras "
                      "compiler feature; here the loss is lowered op by op, with the same "
                      "values", UserWarning, stacklevel=3)
    return use_autogen
