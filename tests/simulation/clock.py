"""Simulated time: one world clock, the store's clock over it, and a skewed clock per replica.

Nothing in the simulation reads the host's clock. Time moves only when the
simulator says so (`WorldClock.advance`), so a seed replays exactly, and
every replica sees it through its own `ReplicaClock`, which may be ahead or
behind (skew), may be stepped by an "operator" or NTP (backward too), and may
be paused (a SIGSTOPped process: its work does not progress, and when it
resumes its monotonic clock has jumped by the whole pause). The store reads
world time through a `StoreClock`, which a fault may step back for a moment.
The event loop's own time is world time too (`WorldClock.loop_time`): a timer
the engine sets (a probe scheduled at a window's end) fires when world time
reaches it, never on the host's clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["EPOCH", "ReplicaClock", "StoreClock", "WorldClock"]

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

    def loop_time(self) -> float:
        """The event loop's clock during a run (`Simulation.run` installs it): world time, so
        `call_later` and `asyncio.timeout` count simulated seconds, deterministically."""
        return self.now


class StoreClock:
    """The database's clock: world time, unless a step set it off for a moment.

    A store clock (a database host's NTP, a VM restored from a snapshot) may
    jump back and come back sooner than a gateway's periodic witness interval,
    so that only the readings taken meanwhile see it. Two shapes:

    - `step_during("claim", -3600.0)`: back an hour for exactly the next claim
      transaction (`during` brackets each store verb), the shape the engine is
      built to see: the claim's own reading is a witness;
    - `step(-3600.0, lasting=0.5)`: back an hour for half a second of world
      time, whatever reads it meanwhile (several claims, a renewal, a probe's
      check). The offset is judged at each reading, so nothing has to wake up
      to end it.

    >>> world = WorldClock()
    >>> store = StoreClock(world)
    >>> store.step(-3600.0, lasting=0.5)
    >>> store() - world.now, store.offset
    (-3600.0, -3600.0)
    >>> world.advance(0.5)
    >>> store() - world.now, store.stepped
    (0.0, False)
    """

    def __init__(self, world: WorldClock) -> None:
        self._world = world
        self._offset = 0.0
        self._until: float | None = None
        self._next: tuple[str, float] | None = None
        self.steps = 0
        self.ended_at = float("-inf")
        """World time the last step ended (a one-transaction step: when it was taken)."""

    def __call__(self) -> float:
        return self._world.now + self.offset

    @property
    def offset(self) -> float:
        """Store time minus world time right now."""
        if self._until is not None and self._world.now >= self._until:
            self._offset, self.ended_at, self._until = 0.0, self._until, None
        return self._offset

    @property
    def stepped(self) -> bool:
        """A step is on, or waits for its transaction."""
        return self.offset != 0.0 or self._next is not None

    def steady_for(self) -> float:
        """World seconds since the last step ended (0 while one is on or waiting)."""
        return 0.0 if self.stepped else self._world.now - self.ended_at

    def step(self, seconds: float, *, lasting: float) -> None:
        """Be `seconds` off world time for the next `lasting` seconds of world time."""
        self._offset, self._until = seconds, self._world.now + lasting
        self.steps += 1

    def heal(self) -> None:
        """No step on, none waiting (the drain: everything heals)."""
        if self.stepped:
            self.ended_at = self._world.now
        self._offset, self._until, self._next = 0.0, None, None

    def step_during(self, verb: str, seconds: float) -> None:
        """Be `seconds` off world time during the next `verb` transaction only."""
        self._next = (verb, seconds)
        self.steps += 1

    @contextmanager
    def during(self, verb: str) -> Iterator[None]:
        """Bracket one store transaction (a memory store verb runs without awaiting, so
        this is exactly its duration): a step waiting for this verb is on inside."""
        if self._next is None or self._next[0] != verb or self._until is not None:
            yield
            return
        _, seconds = self._next
        self._next, self._offset = None, seconds
        try:
            yield
        finally:
            self._offset, self.ended_at = 0.0, self._world.now


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
