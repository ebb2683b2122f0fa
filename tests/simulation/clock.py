"""Simulated time: one world clock (the store's) and a skewed clock per replica.

Nothing in the simulation reads the host's clock. Time moves only when the
simulator says so (`WorldClock.advance`), so a seed replays exactly, and
every replica sees it through its own `ReplicaClock`, which may be ahead or
behind (skew), may be stepped by an "operator" or NTP (backward too), and may
be paused (a SIGSTOPped process: its work does not progress, and when it
resumes its monotonic clock has jumped by the whole pause).
"""

from __future__ import annotations

import asyncio

__all__ = ["EPOCH", "ReplicaClock", "WorldClock"]

EPOCH = 1_700_000_000.0
"""Where world time starts: a plausible POSIX time, so nothing treats 0 as "unset"."""


class WorldClock:
    """The one true time of the simulated world; the memory store reads it as its clock.

    >>> world = WorldClock()
    >>> world.advance(1.5)
    >>> world.now - EPOCH
    1.5
    """

    def __init__(self, start: float = EPOCH) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("world time never goes backwards")
        self.now += seconds

    @property
    def elapsed(self) -> float:
        return self.now - EPOCH


class ReplicaClock:
    """A replica's view of time: `gateway.engine.clock.Clock` over the world clock.

    `time()` is world time plus a skew that may change (step) in either
    direction. `monotonic()` follows world time since the replica started and
    never decreases, whatever happens to the skew. While paused, the replica's
    I/O waits on `resumed()`; the clock itself keeps running, which is exactly
    what a paused process finds when it wakes up.

    >>> world = WorldClock()
    >>> clock = ReplicaClock(world, skew=-2.0)
    >>> world.advance(3.0)
    >>> clock.time() - world.now, clock.monotonic()
    (-2.0, 3.0)
    >>> clock.step(-10.0); clock.monotonic()
    3.0
    """

    def __init__(self, world: WorldClock, *, skew: float = 0.0) -> None:
        self._world = world
        self.skew = skew
        self._origin = world.now
        self._last_monotonic = 0.0
        self._resume: asyncio.Future[None] | None = None
        self.paused_at: float | None = None

    def time(self) -> float:
        return self._world.now + self.skew

    def monotonic(self) -> float:
        value = max(self._last_monotonic, self._world.now - self._origin)
        self._last_monotonic = value
        return value

    def step(self, seconds: float) -> None:
        """The wall clock jumps (NTP, an operator); `monotonic()` is untouched."""
        self.skew += seconds

    def set_skew(self, skew: float) -> None:
        self.skew = skew

    # -- pauses ------------------------------------------------------------------

    @property
    def paused(self) -> bool:
        return self.paused_at is not None

    def pause(self) -> None:
        if self.paused_at is None:
            self.paused_at = self._world.now

    def resume(self) -> None:
        """Wake every I/O of this replica that waited during the pause."""
        self.paused_at = None
        resume, self._resume = self._resume, None
        if resume is not None and not resume.done():
            resume.set_result(None)

    async def resumed(self) -> None:
        """Return at once unless paused; else wait for `resume()` (a simulator action)."""
        while self.paused_at is not None:
            if self._resume is None or self._resume.done():
                self._resume = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._resume)

    def __repr__(self) -> str:
        state = "" if self.paused_at is None else f", paused at {self.paused_at - EPOCH:.2f}"
        return f"ReplicaClock(skew={self.skew:+.2f}{state})"
