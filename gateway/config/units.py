"""Durations and sizes as people write them in a config file.

Operators write `30s`, `24h` and `1MiB`, not `30.0` and `1048576`, and a
typo such as `30sec` must fail at start rather than become a surprising
number. The parsers accept only a few unambiguous forms (sizes are binary
units only: `MB` would leave the reader guessing between 10**6 and 2**20),
and the formatters print the shortest form that parses back to exactly the
same value, so `check-config` shows what the gateway really uses.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from fractions import Fraction

__all__ = ["format_duration", "format_size", "parse_duration", "parse_size"]

# Largest unit first: format_duration prefers the larger unit on a tie.
_DURATION_UNITS: dict[str, Fraction] = {
    "d": Fraction(86400),
    "h": Fraction(3600),
    "m": Fraction(60),
    "s": Fraction(1),
    "ms": Fraction(1, 1000),
}
_SIZE_UNITS: dict[str, int] = {"GiB": 1 << 30, "MiB": 1 << 20, "KiB": 1 << 10, "B": 1}

_DURATION_RE = re.compile(r"(?P<number>[0-9]+(?:\.[0-9]+)?)\s*(?P<unit>ms|s|m|h|d)?")
_SIZE_RE = re.compile(r"(?P<number>[0-9]+)\s*(?P<unit>B|KiB|MiB|GiB)?")

_DURATION_FORMS = (
    "expected a non-negative number of seconds, or a number followed by "
    "ms, s, m, h or d (500ms, 30s, 5m, 24h, 30d)"
)
_SIZE_FORMS = (
    "expected a non-negative whole number of bytes, or a whole number followed by "
    "B, KiB, MiB or GiB (512B, 64KiB, 1MiB, 1GiB)"
)


def parse_duration(value: str | int | float) -> float:
    """Return a duration in seconds.

    >>> parse_duration("500ms"), parse_duration("5m"), parse_duration(30)
    (0.5, 300.0, 30.0)
    """
    # bool is an int subclass; `timeout = true` is a mistake, not one second.
    if isinstance(value, bool):
        raise ValueError(f"invalid duration {value!r}: {_DURATION_FORMS}")
    if isinstance(value, int | float):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"invalid duration {value!r}: {_DURATION_FORMS}")
        return _to_float(value, value)
    if not isinstance(value, str):
        raise ValueError(f"invalid duration {value!r}: {_DURATION_FORMS}")
    match = _DURATION_RE.fullmatch(value.strip())
    if match is None:
        raise ValueError(f"invalid duration {value!r}: {_DURATION_FORMS}")
    factor = _DURATION_UNITS[match["unit"] or "s"]
    # Exact rational arithmetic, rounded once: "100ms" is exactly float(0.1).
    return _to_float(Fraction(match["number"]) * factor, value)


def _to_float(number: Fraction | int | float, original: object) -> float:
    try:
        return float(number)
    except OverflowError:
        raise ValueError(f"invalid duration {original!r}: too large") from None


def format_duration(seconds: float) -> str:
    """Return the shortest whole-unit form of a duration that parses back exactly.

    >>> format_duration(0.5), format_duration(90), format_duration(86400)
    ('500ms', '90s', '1d')
    """
    if isinstance(seconds, bool) or not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"cannot format duration {seconds!r}: not a non-negative number")
    if seconds == 0:
        return "0s"
    best: str | None = None
    exact = Fraction(seconds)
    for unit, factor in _DURATION_UNITS.items():
        candidate = f"{round(exact / factor)}{unit}"
        if parse_duration(candidate) == seconds and (best is None or len(candidate) < len(best)):
            best = candidate
    if best is not None:
        return best
    # Not a whole number of milliseconds: the shortest decimal that round-trips
    # (repr's digits), written positionally because the parser takes no exponent.
    return f"{Decimal(repr(float(seconds))):f}s"


def parse_size(value: str | int) -> int:
    """Return a size in bytes.

    >>> parse_size("64KiB"), parse_size("1MiB"), parse_size(512)
    (65536, 1048576, 512)
    """
    if isinstance(value, bool):
        raise ValueError(f"invalid size {value!r}: {_SIZE_FORMS}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"invalid size {value!r}: {_SIZE_FORMS}")
        return value
    if not isinstance(value, str):
        raise ValueError(f"invalid size {value!r}: {_SIZE_FORMS}")
    match = _SIZE_RE.fullmatch(value.strip())
    if match is None:
        raise ValueError(f"invalid size {value!r}: {_SIZE_FORMS}")
    return int(match["number"]) * _SIZE_UNITS[match["unit"] or "B"]


def format_size(n: int) -> str:
    """Return a size in the largest binary unit that divides it exactly.

    >>> format_size(1048576), format_size(1536), format_size(0)
    ('1MiB', '1536B', '0B')
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"cannot format size {n!r}: not a non-negative integer")
    for unit, factor in _SIZE_UNITS.items():
        if n and n % factor == 0:
            return f"{n // factor}{unit}"
    return "0B"
