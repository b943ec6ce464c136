"""Debug settings for a Cerebras cluster's compiler and runtime (`DebugArgs`).

On a Cerebras system `DebugArgs` is a protocol buffer message sent with each job. There
is no cluster here: these settings are kept, merged, written and read back so programs
that prepare them run unchanged, but nothing acts on them. `DebugArgs` is cstorch's
(`cstorch.backends.debug_args`), the type of the flag `cstorch.backends.csx.debug.
debug_args`, so what `get_debug_args` returns merges into it (`MergeFrom`). Files are JSON
(`write_debug_args` / `get_debug_args`), not the protobuf format of a Cerebras
installation.
"""
import json
import os
from typing import Any

from cstorch.backends.debug_args import DebugArgs, update_from_keys


def get_debug_args(path: os.PathLike | None = None) -> DebugArgs:
    """The debug settings stored at `path` by `write_debug_args`, or empty ones when
    `path` is None."""
    if path is None:
        return DebugArgs()
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"debug args file {path} does not exist; pass None for "
                                f"empty settings or write one with write_debug_args")
    with open(path) as f:
        text = f.read()
    if not text.strip():
        return DebugArgs()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"debug args file {path} is not JSON ({e}); this project stores "
                         f"debug args as JSON written by write_debug_args and cannot read "
                         f"the protobuf files of a Cerebras installation") from e
    if not isinstance(data, dict):
        raise ValueError(f"debug args file {path} holds a JSON {type(data).__name__}, "
                         f"expected an object")
    return DebugArgs(data)


def write_debug_args(debug_args: DebugArgs, path: os.PathLike) -> None:
    """Store `debug_args` at `path` (JSON), replacing the file atomically."""
    if not isinstance(debug_args, DebugArgs):
        raise TypeError(f"write_debug_args takes a DebugArgs, got {type(debug_args).__name__}")
    path = os.fspath(path)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(debug_args.to_dict(), f, indent=2, sort_keys=True)
    os.replace(tmp, path)


def update_debug_args_from_keys(debug_args: DebugArgs, keys: dict[str, Any]) -> None:
    """Set fields named by dotted paths: `{"debug_usr.compile.threads": 4}` sets
    `debug_args.debug_usr.compile.threads = 4` (the `--debug_args a.b.c=value` flag)."""
    update_from_keys(debug_args, keys)


__all__ = ["DebugArgs", "get_debug_args", "write_debug_args", "update_debug_args_from_keys"]
