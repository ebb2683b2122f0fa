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
readings) and keeps the moment since which the two have kept pace. Every
reading the engine takes for a decision is a witness (a claim, a lease
renewal, a release check), besides one every `WITNESS_INTERVAL` seconds, so
a step lasting less than that interval is still seen by the decision it
could spoil. Each witness is judged against the one before it only: the
drift allowed is 0.1% of the time between the two, so a ten-minute step is
as visible after a week of uptime as after a second, and the store's clock
going back by any amount between two readings is a step. The time counted
since a record's moment is the smaller of

- the store-clock time since that moment, and
- the monotonic time since the store's clock was last seen to keep pace
  from (this process's first witness, or the last step it saw).

If the moment falls inside that stretch, no step happened since, so the
store-clock time is true; if it falls before, the stretch itself is a
lower bound. Either way a step can only make a grace longer, never shorter.
The cost is liveness, not safety: after a step, a release waits until a
whole grace passed in this process. So that a restart does not cost the
same, every process also writes its latest witness to the store, one row
per boot of its host (`/proc/sys/kernel/random/boot_id`): processes of one
boot share one monotonic clock, so a process that starts within
`TRAIL_GAP` of a witness that kept pace with its own first reading carries
on from that witness's trusted stretch instead of starting its own.

A clock that is back for a moment would date a new attempt an hour early,
and another process that did not read it meanwhile would count that
attempt's window as long over. So after a backward step the clock is
*unsettled* (`GraceClock.unsettled`): no claim is sent on it and no
renewal vouches for a lease, until a witness sees it come back or every
live process has read it. Two readings vouch for the clock between them
only when they are less than `UNWATCHED_GAP` apart (it is assumed not to
step twice within that); a process that starts, or that went longer
without a reading (paused, stalled), checks its reading against the
latest reading of every host's witness (`GraceClock.compare_with`): a
clock earlier than a time it already showed someone has stepped back.

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
import contextlib
import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, Protocol

if TYPE_CHECKING:
    from gateway.engine.clock import Clock

__all__ = [
    "HOST_BOOT",
    "SETTLE",
    "UNWATCHED_GAP",
    "WITNESS_INTERVAL",
    "GraceClock",
    "WitnessStore",
    "start_witness",
]

log = logging.getLogger("gateway.clock")

STEP_TOLERANCE = 0.5
"""Seconds by which the store's clock may run ahead of the monotonic one between two
witnesses and still be noise, not a step (the store read's own latency is already
bounded by the monotonic readings around it, whose width is allowed besides)."""
BACKWARD_TOLERANCE = 1e-3
"""Seconds by which the store's clock may seem to run behind the monotonic one between two
witnesses: only the rounding of stored times. A clock that slews never goes back, so a
reading earlier than the monotonic bracket allows is a backward step, however small."""
DRIFT_RATE = 1e-3
"""Disagreement allowed per second between two witnesses (never accumulated over longer):
NTP slews a clock by at most 500 ppm."""
WITNESS_INTERVAL = 2.0
"""How often a process reads the store's clock only to watch it; so that two opposite
steps in a row (back, then forward) are seen as steps, not as no change."""
TRAIL_GAP = 60.0
"""The longest time without a witness across which a new process still trusts the trail."""
UNWATCHED_GAP = 2 * WITNESS_INTERVAL
"""The longest time between two readings across which they vouch for the clock between
them: the clock is assumed not to step twice within it. Readings farther apart (a paused
process, a stalled loop) may both be on a stepped clock and agree; the process then checks
its reading against the other processes' witnesses (`GraceClock.compare_with`)."""
SETTLE = 2 * WITNESS_INTERVAL + STEP_TOLERANCE
"""How long after a backward step the store's clock is not trusted to date a new record
(unless it came back first): by then every live process's periodic witness has read the
stepped clock, so each judges times written on it knowing of the step."""


def _host_boot() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:  # not Linux: every process trusts the store's clock from its own start
        return None


HOST_BOOT = _host_boot()
"""This boot of this host: the processes whose monotonic readings compare."""


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
        self._first: _Witness | None = None
        self._latest: _Witness | None = None
        self._trusted_from: _Witness | None = None
        self._back_at: float | None = None
        """Monotonic time since which the clock is unsettled (`unsettled`): the last backward
        step not yet undone by a forward one, or the end of a stretch nobody watched."""
        self._came_back = asyncio.Event()
        """Set when the clock is settled again (`settled` waits for it)."""
        self._unwatched = False
        """A stretch longer than `UNWATCHED_GAP` went without a reading: `rejoining` until a
        check against the other processes' witnesses (`compare_with`) vouches for it."""
        self.steps_seen = 0

    def witness(self, store_now: float, *, before: float, after: float) -> None:
        """Compare one reading of the store's clock with the monotonic time around it, and
        with the witness before it (`before` and `after` bracket the read: take `after`
        right before calling, with no `await` between)."""
        sample = _Witness(store_now, before, after)
        previous, self._latest = self._latest, sample
        if previous is None or self._trusted_from is None:
            self._first = self._trusted_from = sample
            return
        if not _kept_pace(previous, sample):
            backward = sample.store - previous.store < sample.before - previous.after
            self._stepped(
                sample,
                by=(sample.store - previous.store) - (sample.before - previous.after),
                store_seconds=sample.store - previous.store,
            )
            if backward:
                self._unsettle(sample.after)
            elif self._back_at is not None:
                self._settle()
        if sample.after - previous.before > UNWATCHED_GAP:
            # Paused, stalled, or the store was slow: the clock may have stepped back and
            # come back, then stepped back again, and two readings on a stepped clock agree.
            self._unwatched = True
            self._unsettle(sample.after)

    def _unsettle(self, since: float) -> None:
        self._back_at = since
        if self._came_back.is_set():
            self._came_back = asyncio.Event()

    def _settle(self) -> None:
        self._back_at = None
        self._came_back.set()

    @property
    def rejoining(self) -> bool:
        """True after a stretch nobody watched, until `compare_with` checks this process's
        latest reading against every host's latest witness (as when it started)."""
        return self._unwatched

    def _stepped(self, sample: _Witness, *, by: float, store_seconds: float) -> None:
        self.steps_seen += 1
        log.warning(
            "the store's clock stepped by about %+.1f s; graces that release a key count "
            "from now on this process's own clock",
            by,
            extra={"event": "clock_step", "store_seconds": store_seconds},
        )
        self._trusted_from = sample

    def unsettled(self) -> bool:
        """True while a backward step of the store's clock may not have been seen by every
        process: less than `SETTLE` ago, and the clock has not come back since.

        A record dated on a clock that is back for a moment (an hour back, for less than
        the witnesses' interval) looks an hour old to a process that never saw the step,
        and that process would count its release window as long over. So nothing is
        claimed to be sent while the clock is unsettled (`IdempotencyEngine._claim`), and
        no lease renewal read on it counts as surely held (`LeaseKeeper`).
        """
        return self._back_at is not None and self._clock.monotonic() - self._back_at < SETTLE

    async def settled(self) -> None:
        """Wait (at most `SETTLE`) until the clock is not `unsettled`: a witness sees it come
        back, or the step has lasted long enough for every process to have seen it."""
        if self._back_at is None or not self.unsettled():
            return
        left = SETTLE - (self._clock.monotonic() - self._back_at)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(left):
                await self._came_back.wait()

    def record(self) -> bytes | None:
        """This process's latest witness and trusted stretch, for the next process of its boot."""
        if self._latest is None or self._trusted_from is None:
            return None
        return json.dumps({"latest": self._latest, "trusted": self._trusted_from}).encode()

    def adopt(self, trail: bytes | None) -> bool:
        """Carry on from another process's trusted stretch (same boot), when its latest
        witness is within `TRAIL_GAP` of this process's first reading and kept pace with
        it, and no step was seen here since. True when adopted."""
        first, here = self._first, self._trusted_from
        if trail is None or first is None or here is None or self.steps_seen:
            return False
        try:
            document = json.loads(trail)
            latest, trusted = _Witness(*document["latest"]), _Witness(*document["trusted"])
        except (ValueError, TypeError, KeyError):
            return False
        # Another live process (a sibling worker) may have written after this one started.
        earlier, later = (latest, first) if latest.after <= first.before else (first, latest)
        if later.before - earlier.after > TRAIL_GAP or not _kept_pace(earlier, later):
            return False
        if trusted.after < here.after:
            self._trusted_from = trusted
        return True

    def compare_with(self, witnesses: Iterable[bytes]) -> None:
        """Check this process's latest reading against the latest reading of every host's
        last process (`record`): a store clock that reads earlier than a time it already
        showed someone has stepped back, though this new process saw no step itself.

        A process that starts while the clock is back for a moment would otherwise take
        the stepped time for the true one, and write leases that every other process
        reads as long expired. So this is a backward step like any other: unsettled
        until the clock comes back or every process has seen it (`unsettled`).
        """
        latest, rejoining, self._unwatched = self._latest, self._unwatched, False
        shown = [reading for witness in witnesses if (reading := _latest_of(witness)) is not None]
        if latest is None or not shown or latest.store >= max(shown) - BACKWARD_TOLERANCE:
            if rejoining and self._back_at is not None:
                self._settle()  # nothing behind what the others read: watched again
            return
        self._stepped(latest, by=latest.store - max(shown), store_seconds=0.0)
        self._unsettle(latest.after)

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

    def trusted_for(self) -> float:
        """Seconds for which this process has seen the store's clock keep pace with its
        own (0 before its first witness): the longest grace it can vouch for without a
        new reading. A window longer than this counts as not yet over."""
        if self._trusted_from is None:
            return 0.0
        return max(0.0, self._clock.monotonic() - self._trusted_from.after)

    def monotonic(self) -> float:
        return self._clock.monotonic()


class WitnessStore(Protocol):
    """What `start_witness` needs of a store (`gateway.store.base.Store` has it)."""

    async def now(self) -> float: ...

    async def read_clock_witnesses(self) -> dict[str, bytes]: ...

    async def write_clock_witness(self, host: str, witness: bytes) -> None: ...


async def start_witness(
    store: WitnessStore,
    graces: GraceClock,
    *,
    host: str | None = HOST_BOOT,
    interval: float = WITNESS_INTERVAL,
) -> asyncio.Task[None]:
    """Take this process's first witness (joining the trail an earlier process of its
    boot left, if it can) before it serves, then keep witnessing every `interval`
    seconds in a task the caller cancels at shutdown."""
    await _witness(store, graces, host, join=True)

    async def keep_witnessing() -> None:
        while True:
            await asyncio.sleep(interval)
            await _witness(store, graces, host, join=False)

    return asyncio.create_task(keep_witnessing(), name="clock-witness")


async def _witness(
    store: WitnessStore, graces: GraceClock, host: str | None, *, join: bool
) -> None:
    try:
        before = graces.monotonic()
        store_now = await store.now()
        graces.witness(store_now, before=before, after=graces.monotonic())
        if join or graces.rejoining:
            witnesses = await store.read_clock_witnesses()
            if join and host is not None and graces.adopt(witnesses.get(host)):
                log.info("the store's clock is trusted from before this process started")
            graces.compare_with(witnesses.values())
        record = graces.record()
        if host is not None and record is not None:
            await store.write_clock_witness(host, record)
    except Exception as exc:  # a store outage is reported by the requests that meet it
        log.debug("clock witness skipped: %s", exc)


def _latest_of(witness: bytes) -> float | None:
    """The store time of a `GraceClock.record`'s latest reading (None if unreadable)."""
    try:
        return float(json.loads(witness)["latest"][0])
    except (ValueError, TypeError, KeyError, IndexError):
        return None


def _kept_pace(earlier: _Witness, later: _Witness) -> bool:
    """True when the store's clock moved between two readings as the monotonic one did.

    The store's reading lies somewhere inside each bracket, so the store time
    between the two lies between `shortest` and `longest` monotonic seconds
    (the brackets' widths are the allowance for the reads' own latency), give
    or take the drift of that one interval. Ahead by more than `STEP_TOLERANCE`
    is a forward step; behind at all (beyond rounding) is a backward one.
    """
    shortest, longest = later.before - earlier.after, later.after - earlier.before
    drift = DRIFT_RATE * max(longest, 0.0)
    moved = later.store - earlier.store
    return shortest - drift - BACKWARD_TOLERANCE <= moved <= longest + drift + STEP_TOLERANCE
