"""Byte units: convert between them and print sizes for people.

Decimal units are powers of 1000 (`KB`, `MB`, `GB`, `TB`, `PB`), binary ones powers of
1024 (`KiB`, `MiB`, `GiB`, `TiB`, `PiB`), as in SI/IEC and in Hugging Face's shard sizes
("10GB" is 10**10 bytes). Unit names are matched without regard to case; `B` is a byte.
"""

_DECIMAL = ["B", "KB", "MB", "GB", "TB", "PB"]
_BINARY = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]
_FACTORS = {**{u.lower(): 1000 ** i for i, u in enumerate(_DECIMAL)},
            **{u.lower(): 1024 ** i for i, u in enumerate(_BINARY)}}
_CANONICAL = {u.lower(): u for u in _DECIMAL + _BINARY}


def _factor(unit: str, role: str) -> int:
    if not isinstance(unit, str) or unit.strip().lower() not in _FACTORS:
        raise ValueError(f"unknown {role} byte unit {unit!r}: expected one of "
                         f"{_DECIMAL + _BINARY[1:]} (any case)")
    return _FACTORS[unit.strip().lower()]


def convert_byte_unit(value: int | float, target_unit: str, src_unit: str = "B",
                      ) -> int | float:
    """`value` in `src_unit` expressed in `target_unit`: `convert_byte_unit(10, "B",
    src_unit="GB") == 10_000_000_000`. The result is an int when it is a whole number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"value must be a number of {src_unit}, got {value!r}")
    num = value * _factor(src_unit, "source")
    target = _factor(target_unit, "target")
    if isinstance(num, int) and num % target == 0:
        return num // target
    result = num / target
    return int(result) if float(result).is_integer() else result


def bytes_to_human(num_bytes: int | float, binary: bool = True, precision: int = 2) -> str:
    """A size for people: `bytes_to_human(1536) == "1.50 KiB"`, `bytes_to_human(12) ==
    "12 B"`. Binary units by default; `binary=False` uses decimal units."""
    if isinstance(num_bytes, bool) or not isinstance(num_bytes, (int, float)):
        raise TypeError(f"num_bytes must be a number, got {num_bytes!r}")
    units, base = (_BINARY, 1024) if binary else (_DECIMAL, 1000)
    value, unit = float(num_bytes), units[0]
    for unit in units:
        if abs(value) < base or unit == units[-1]:
            break
        value /= base
    if unit == "B":
        return f"{int(num_bytes) if float(num_bytes).is_integer() else num_bytes} B"
    return f"{value:.{precision}f} {unit}"


__all__ = ["convert_byte_unit", "bytes_to_human"]
