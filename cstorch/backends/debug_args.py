"""`DebugArgs`: debug settings of a Cerebras cluster's compiler and runtime, the type of
the CSX flag `cstorch.backends.csx.debug.debug_args`.

On a Cerebras system this is a protocol buffer message sent with each job. There is no
cluster here: the settings are kept and merged so programs that prepare them run
unchanged, but nothing acts on them. The class keeps the parts of the message API that
programs use (`MergeFrom`, `CopyFrom`, `Clear`, `HasField`, nested fields created on first
access). `cerebras.appliance.utils.debug_args` reads and writes it to files.
"""
from typing import Any

_SCALARS = (bool, int, float, str, type(None))


class DebugArgs:
    """A tree of settings: `args.debug_usr.some_flag = True`. Reading a field that was
    never set gives an empty sub-message, as in a protocol buffer, so nested fields can be
    set without creating their parents first."""

    def __init__(self, fields: dict[str, Any] | None = None, **kwargs):
        object.__setattr__(self, "_fields", {})
        for key, value in {**(fields or {}), **kwargs}.items():
            setattr(self, key, value)

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        fields = self._fields
        if name not in fields:
            fields[name] = DebugArgs()
        return fields[name]

    def __setattr__(self, name, value):
        if name.startswith("_"):
            raise AttributeError(f"DebugArgs field names cannot start with '_': {name!r}")
        if isinstance(value, dict):
            value = DebugArgs(value)
        elif isinstance(value, (list, tuple)):
            value = [DebugArgs(v) if isinstance(v, dict) else v for v in value]
        elif not isinstance(value, (DebugArgs,) + _SCALARS):
            raise TypeError(f"DebugArgs field {name!r} must be a bool, int, float, str, list, "
                            f"dict or DebugArgs, got {type(value).__name__}")
        self._fields[name] = value

    def __delattr__(self, name):
        self._fields.pop(name, None)

    def __eq__(self, other):
        return isinstance(other, DebugArgs) and self.to_dict() == other.to_dict()

    def __repr__(self):
        return f"DebugArgs({self.to_dict()!r})"

    def __bool__(self):
        return bool(self.to_dict())

    def HasField(self, name: str) -> bool:  # noqa: N802 (protobuf spelling)
        value = self._fields.get(name)
        return value is not None and not (isinstance(value, DebugArgs) and not value)

    def MergeFrom(self, other: "DebugArgs") -> None:  # noqa: N802
        """Copy every field set in `other` into this one; sub-messages merge field by
        field, lists are appended, scalars are replaced."""
        if not isinstance(other, DebugArgs):
            raise TypeError(f"MergeFrom takes a DebugArgs, got {type(other).__name__}")
        for name, value in other._fields.items():
            mine = self._fields.get(name)
            if isinstance(value, DebugArgs):
                if not isinstance(mine, DebugArgs):
                    mine = self._fields[name] = DebugArgs()
                mine.MergeFrom(value)
            elif isinstance(value, list) and isinstance(mine, list):
                mine.extend(value)
            else:
                self._fields[name] = list(value) if isinstance(value, list) else value

    def CopyFrom(self, other: "DebugArgs") -> None:  # noqa: N802
        self.Clear()
        self.MergeFrom(other)

    def Clear(self) -> None:  # noqa: N802
        self._fields.clear()

    def to_dict(self) -> dict[str, Any]:
        """The fields that are set, as nested dicts (empty sub-messages left out)."""
        out = {}
        for name, value in self._fields.items():
            if isinstance(value, DebugArgs):
                value = value.to_dict()
                if not value:
                    continue
            elif isinstance(value, list):
                value = [v.to_dict() if isinstance(v, DebugArgs) else v for v in value]
            out[name] = value
        return out


def update_from_keys(debug_args: DebugArgs, keys: dict[str, Any]) -> None:
    """Set fields named by dotted paths: `{"debug_usr.compile.threads": 4}` sets
    `debug_args.debug_usr.compile.threads = 4` (the `--debug_args a.b.c=value` flag)."""
    if not isinstance(keys, dict):
        raise TypeError(f"keys must be a dict of dotted field path to value, got "
                        f"{type(keys).__name__}")
    for dotted, value in keys.items():
        *parents, leaf = str(dotted).split(".")
        if not leaf or any(not p for p in parents):
            raise ValueError(f"invalid debug args key {dotted!r}: expected a dotted field "
                             f"path such as 'debug_usr.flag'")
        node = debug_args
        for part in parents:
            child = getattr(node, part)
            if not isinstance(child, DebugArgs):
                raise ValueError(f"cannot set debug args key {dotted!r}: {part!r} is a "
                                 f"value ({child!r}), not a group of fields")
            node = child
        setattr(node, leaf, value)


__all__ = ["DebugArgs", "update_from_keys"]
