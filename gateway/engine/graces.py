"""How long ago a record's moment really was, for a grace after which a key may be sent again.

A record's times are written by the store's clock (the database's on
PostgreSQL, the host's on SQLite), and judged on that clock: a replica whose
clock is off decides as one whose clock is right. But the store's clock can
*step*: NTP, an operator, a VM resumed from a snapshot. A forward step of ten
minutes would make a probe's five-minute `not_applied_after` grace look long
over while the tool is still applying the last send, and the key would be
released into a second effect.

So a grace that lets a key be sent again never counts more than time that
really passed in the deciding process. `GraceClock` watches the store's
clock against this process's monotonic clock (every store-clock reading it
is shown is a *witness*: the store's time, read between two monotonic
readings) and keeps the moment since which the two have kept pace. The time
counted since a record's moment is the smaller of

- the store-clock time since that moment, and
- the monotonic time since the store's clock was last seen to keep pace
  from (this process's first witness, or the last step it saw).

If the moment falls inside that stretch, no step happened since, so the
store-clock time is true; if it falls before, the stretch itself is a
lower bound. Either way a step can only make a grace longer, never shorter.
The cost is liveness, not safety: after a restart, or after a step, a
release waits until a whole grace passed in this process.

>>> class Fake:
...     def __init__(self): self.t = 100.0
...     def time(self): return self.t
...     def monotonic(self): return self.t
>>> clock = Fake(); graces = GraceClock(clock)
>>> graces.witness(1000.0, before=100.0, after=100.0)
>>> graces.elapsed_since(990.0, store_now=1060.0, before=160.0, after=160.0)
60.0
>>> graces.elapsed_since(990.0, store_now=1700.0, before=161.0, after=161.0)  # +10 min step
0.0
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from gateway.engine.clock import Clock

__all__ = ["WITNESS_INTERVAL", "GraceClock", "run_witness"]

log = logging.getLogger("gateway.clock")

STEP_TOLERANCE = 0.5
"""Seconds of disagreement between the two clocks taken as noise, not a step (the store
read's own latency is already bounded by the monotonic readings around it)."""
DRIFT_RATE = 1e-3
"""Disagreement allowed per second that passed: NTP slews a clock by at most 500 ppm."""
WITNESS_INTERVAL = 2.0
"""How often a process reads the store's clock only to watch it; so that two opposite
steps in a row (back, then forward) are seen as steps, not as no change."""


class _Witness(NamedTuple):
    store: float
    before: float
    """Monotonic time just before the store's clock was read."""
    after: float
    """Monotonic time just after: the reading happened between the two."""


class GraceClock:
    """The store's clock, trusted only as far as this process's monotonic clock vouches for it."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._trusted_from: _Witness | None = None
        self.steps_seen = 0

    def witness(self, store_now: float, *, before: float, after: float) -> None:
        """Compare one reading of the store's clock with the monotonic time around it."""
        sample = _Witness(store_now, before, after)
        anchor = self._trusted_from
        if anchor is None:
            self._trusted_from = sample
            return
        # The real time between the two readings lies within these bounds.
        shortest, longest = sample.before - anchor.after, sample.after - anchor.before
        slack = STEP_TOLERANCE + DRIFT_RATE * max(longest, 0.0)
        passed = sample.store - anchor.store
        if shortest - slack <= passed <= longest + slack:
            return
        self.steps_seen += 1
        log.warning(
            "the store's clock stepped by about %+.1f s; graces that release a key count "
            "from now on this process's own clock",
            passed - (shortest + longest) / 2,
            extra={"event": "clock_step", "store_seconds": passed, "monotonic_seconds": longest},
        )
        self._trusted_from = sample

    def elapsed_since(
        self, moment: float, *, store_now: float, before: float, after: float
    ) -> float:
        """Seconds that surely passed since `moment` (store clock), as read at `store_now`.

        `before` and `after` are this process's monotonic readings around the
        read that returned `store_now`; that read is a witness too, so a step
        that happened just before the decision is seen by it.
        """
        self.witness(store_now, before=before, after=after)
        assert self._trusted_from is not None
        kept_pace = before - self._trusted_from.after
        return max(0.0, min(store_now - moment, kept_pace))

    def monotonic(self) -> float:
        return self._clock.monotonic()


async def run_witness(
    now: Callable[[], Awaitable[float]], graces: GraceClock, *, interval: float = WITNESS_INTERVAL
) -> None:
    """Read the store's clock every `interval` seconds for `graces`, until cancelled."""
    while True:
        before = graces.monotonic()
        try:
            store_now = await now()
        except Exception as exc:  # a store outage is reported by the requests that meet it
            log.debug("clock witness skipped: %s", exc)
        else:
            graces.witness(store_now, before=before, after=graces.monotonic())
        await asyncio.sleep(interval)
