"""INI settings: named compiler and runtime switches of a Cerebras cluster, carried in
`DebugArgs.ini`. There is no such compiler or runtime here, so they are stored only."""
from cerebras.appliance.utils.debug_args import DebugArgs

_TYPES = (bool, int, float, str)


def _check(debug_args, kwargs):
    if not isinstance(debug_args, DebugArgs):
        raise TypeError(f"the first argument must be a DebugArgs, got {type(debug_args).__name__}")
    for key, value in kwargs.items():
        if not isinstance(value, _TYPES):
            raise TypeError(f"ini {key!r} must be a bool, int, float or str, got "
                            f"{type(value).__name__}")


def set_ini(debug_args: DebugArgs, **kwargs) -> None:
    """Set each INI `name=value` in `debug_args.ini`, replacing any value already set."""
    _check(debug_args, kwargs)
    for key, value in kwargs.items():
        setattr(debug_args.ini, key, value)


def set_default_ini(debug_args: DebugArgs, **kwargs) -> None:
    """Set each INI `name=value` in `debug_args.ini` only where it is not already set, so
    a user's own setting wins over the program's default."""
    _check(debug_args, kwargs)
    for key, value in kwargs.items():
        if not debug_args.ini.HasField(key):
            setattr(debug_args.ini, key, value)


__all__ = ["set_ini", "set_default_ini"]
