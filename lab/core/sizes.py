"""Sizes, one grammar everywhere (a scenario's `limits`, the `cache_cap` setting): a number and an
optional unit, every unit binary whatever its spelling (k = kb = kib = KiB = 1024), as Docker reads
`docker run --memory` (go-units RAMInBytes)."""

from __future__ import annotations

import re
from typing import Any

_SIZE_RE = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*")
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50, "e": 1 << 60}
_NAMES = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def parse_size(value: str | int) -> int:
    """Bytes in a size: `512m`, `8g`, `8GiB`, `50GB`, `1.5g`, `1048576`; ValueError if unreadable."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError(f"not a size: {_show(value)}")
    if isinstance(value, int):
        return value
    match = _SIZE_RE.fullmatch(value) if len(value) <= 32 else None
    unit = match.group(2).lower() if match else ""
    if unit.endswith("b") and len(unit) > 1:
        unit = unit[:-1]
    if unit.endswith("i") and len(unit) > 1:
        unit = unit[:-1]
    if match is None or unit not in _UNITS:
        raise ValueError(f"not a size: {_show(value)}")
    return int(float(match.group(1)) * _UNITS[unit])


class Size(int):
    """A size in bytes that says itself in binary units ("50.0 GiB")."""

    def words(self, separator: str = " ") -> str:
        num = float(self)
        for unit in _NAMES:
            if abs(num) < 1024:
                return f"{num:0.0f}{separator}{unit}" if unit == "B" else f"{num:0.1f}{separator}{unit}"
            num /= 1024
        return f"{num:0.1f}{separator}EiB"


def to_size(value: Any) -> Any:
    """A pydantic BeforeValidator: a size in the one grammar, as a Size; anything else is refused."""
    if value is None or isinstance(value, Size):
        return value
    try:
        return Size(parse_size(value))
    except ValueError:
        raise ValueError(f"could not parse {_show(value)} as a size (a number and a unit, all binary: "
                         "512m, 8g, 50GiB)") from None


def as_size(value: int | None) -> Size | None:
    """A pydantic AfterValidator: the int pydantic made back into a Size."""
    return None if value is None else Size(value)


def _show(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
