"""Durations and sizes: the config's human forms parse, format and round-trip."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.config.units import format_duration, format_size, parse_duration, parse_size


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("500ms", 0.5),
        ("30s", 30.0),
        ("5m", 300.0),
        ("24h", 86400.0),
        ("30d", 2592000.0),
        ("1.5s", 1.5),
        ("100ms", 0.1),
        ("0", 0.0),
        ("45", 45.0),
        (" 5m ", 300.0),
        (12, 12.0),
        (0.25, 0.25),
    ],
)
def test_parse_duration_accepts_documented_forms(text: str | int | float, seconds: float) -> None:
    """Every documented duration form, and plain numbers as seconds, parse to seconds."""
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "  ",
        "abc",
        "5x",
        "-1s",
        "-5",
        "1.s",
        "s",
        "5 minutes",
        "1e3s",
        "5S",
        "nan",
        -1,
        -0.5,
        math.inf,
        math.nan,
        True,
    ],
)
def test_parse_duration_rejects_other_forms(bad: object) -> None:
    """Negative, empty, unknown units and non-numbers are refused, naming the accepted forms."""
    with pytest.raises(ValueError, match=r"invalid duration .*500ms, 30s, 5m, 24h, 30d"):
        parse_duration(bad)  # type: ignore[arg-type]


def test_parse_duration_rejects_overflow() -> None:
    """A number too large for a float is a ValueError, not an OverflowError."""
    with pytest.raises(ValueError, match="too large"):
        parse_duration("9" * 400 + "d")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (0.5, "500ms"),
        (0.1, "100ms"),
        (1.5, "1500ms"),
        (30, "30s"),
        (60, "1m"),
        (90, "90s"),
        (300, "5m"),
        (86400, "1d"),
        (2592000, "30d"),
        (1e-4, "0.0001s"),
    ],
)
def test_format_duration_is_shortest_whole_unit(seconds: float, text: str) -> None:
    """Durations format in the shortest whole-unit form, milliseconds before decimals."""
    assert format_duration(seconds) == text


@given(st.floats(min_value=0, max_value=1e15, allow_nan=False, allow_infinity=False))
def test_duration_round_trips(seconds: float) -> None:
    """Any non-negative finite duration formats to a string that parses back exactly."""
    assert parse_duration(format_duration(seconds)) == seconds


@given(st.integers(min_value=0, max_value=10**9), st.sampled_from(["ms", "s", "m", "h", "d"]))
def test_whole_unit_durations_round_trip_through_format(number: int, unit: str) -> None:
    """A parsed whole-unit duration formats to a form of the same value, never longer."""
    text = f"{number}{unit}"
    formatted = format_duration(parse_duration(text))
    assert parse_duration(formatted) == parse_duration(text)
    assert len(formatted) <= max(len(text), 2)


@pytest.mark.parametrize("bad", [-1.0, math.inf, math.nan])
def test_format_duration_rejects_non_durations(bad: float) -> None:
    """Negative, infinite and NaN durations cannot be formatted."""
    with pytest.raises(ValueError, match="cannot format duration"):
        format_duration(bad)


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("512B", 512),
        ("64KiB", 65536),
        ("1MiB", 1048576),
        ("1GiB", 1 << 30),
        ("0", 0),
        ("100", 100),
        (" 2 KiB ", 2048),
        (4096, 4096),
    ],
)
def test_parse_size_accepts_binary_units(text: str | int, size: int) -> None:
    """Sizes in B, KiB, MiB, GiB and plain integers parse to bytes."""
    assert parse_size(text) == size


@pytest.mark.parametrize(
    "bad",
    ["", "1KB", "1MB", "1kib", "1.5MiB", "-1", "MiB", "1TiB", -1, True, 1.0],
)
def test_parse_size_rejects_ambiguous_forms(bad: object) -> None:
    """Decimal units, fractions, negatives and unknown units are refused, naming the forms."""
    with pytest.raises(ValueError, match=r"invalid size .*B, KiB, MiB or GiB"):
        parse_size(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("size", "text"),
    [
        (0, "0B"),
        (1, "1B"),
        (1023, "1023B"),
        (1024, "1KiB"),
        (1536, "1536B"),
        (1048576, "1MiB"),
        (3 << 30, "3GiB"),
        (1 << 40, "1024GiB"),
    ],
)
def test_format_size_uses_largest_exact_unit(size: int, text: str) -> None:
    """Sizes format in the largest binary unit that divides them exactly."""
    assert format_size(size) == text


@given(st.integers(min_value=0, max_value=1 << 50))
def test_size_round_trips(size: int) -> None:
    """Any non-negative size formats to a string that parses back exactly."""
    assert parse_size(format_size(size)) == size


def test_format_size_rejects_negative() -> None:
    """A negative size cannot be formatted."""
    with pytest.raises(ValueError, match="cannot format size"):
        format_size(-1)
