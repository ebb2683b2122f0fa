"""The clocks the engine reads, passed in rather than imported, so a simulation can own them.

Two readings, for two different questions:

- `time()` is wall-clock POSIX seconds. It may step (NTP, an operator, a VM
  resumed from a snapshot), so the engine uses it only to label what it
  writes down (evidence, resolutions), never to judge a record: a record's
  times are compared with the clock that wrote them, which the store reports
  as `Operation.observed_at`.
- `monotonic()` never steps and measures durations on this host: how long
  ago this process claimed a key, how long a probe must back off.

>>> clock = SystemClock()
>>> clock.monotonic() <= clock.monotonic()
True
"""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["SYSTEM_CLOCK", "Clock", "SystemClock"]


class Clock(Protocol):
    """A source of time; implementations must keep `monotonic()` non-decreasing."""

    def time(self) -> float:
        """Wall-clock POSIX seconds; may jump forwards or backwards."""

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin; never decreases."""


class SystemClock:
    """The host's clocks (`time.time`, `time.monotonic`)."""

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def __repr__(self) -> str:
        return "SystemClock()"


SYSTEM_CLOCK = SystemClock()
"""The clock every production component uses unless given another."""
