"""`GraceClock`: the time counted for a grace that releases a key is never more than
really passed, whatever the store's clock does."""

from __future__ import annotations

import asyncio

from gateway.engine.clock import SystemClock
from gateway.engine.graces import SETTLE, UNWATCHED_GAP, GraceClock, start_witness


class StoppedClock:
    """A monotonic clock that moves only when told (for `unsettled`, which reads it)."""

    def __init__(self, monotonic: float) -> None:
        self.now = monotonic

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now


def counted(graces: GraceClock, moment: float, store_now: float, monotonic: float) -> float:
    return graces.elapsed_since(moment, store_now=store_now, before=monotonic, after=monotonic)


def started(store_now: float = 1000.0, monotonic: float = 10.0) -> GraceClock:
    graces = GraceClock(SystemClock())
    graces.witness(store_now, before=monotonic, after=monotonic)
    return graces


def test_a_clock_that_keeps_pace_counts_store_time() -> None:
    """With no step, the time since a moment after the first witness is the store's."""
    graces = started()
    assert counted(graces, 1010.0, 1100.0, 110.0) == 90.0


def test_a_moment_before_the_process_started_counts_from_its_start() -> None:
    """A moment older than the first witness counts only the time this process saw."""
    graces = started()
    assert counted(graces, 400.0, 1030.0, 40.0) == 30.0


def test_a_forward_step_restarts_the_count() -> None:
    """A ten-minute forward step between two readings counts from the step, not before."""
    graces = started()
    assert counted(graces, 1000.0, 1060.0, 70.0) == 60.0
    assert counted(graces, 1000.0, 1700.0, 80.0) == 0.0
    assert counted(graces, 1000.0, 1760.0, 140.0) == 60.0
    assert graces.steps_seen == 1


def test_a_backward_then_forward_step_seen_by_a_witness_is_a_step() -> None:
    """Two opposite steps are caught when a witness read the clock between them."""
    graces = started()
    graces.witness(400.0, before=20.0, after=20.0)  # ten minutes back
    assert counted(graces, 410.0, 1030.0, 40.0) == 0.0  # forward again: counts from now
    assert graces.steps_seen == 2


def test_a_ten_minute_step_is_seen_after_a_week_as_after_a_second() -> None:
    """The drift allowed is 0.1% of the time since the previous witness, never of the
    uptime: after a week of witnesses every 2 s, a ten-minute forward step is a step (the
    old anchor-based allowance let 604 s pass as drift by then)."""
    for uptime in (1.0, 86400.0, 7 * 86400.0, 30 * 86400.0):
        graces = started(store_now=1000.0, monotonic=10.0)
        store, monotonic = 1000.0, 10.0
        # The long quiet stretch in three witnesses (gaps are allowed their own drift),
        # then the last two seconds before the step as one periodic witness would see them.
        for gap in (uptime / 2, uptime / 2 - 2.0 if uptime > 2 else 0.0):
            store, monotonic = store + gap, monotonic + gap
            graces.witness(store, before=monotonic, after=monotonic)
        assert graces.steps_seen == 0, uptime
        store, monotonic = store + 2.0 + 600.0, monotonic + 2.0
        assert counted(graces, 1000.0, store, monotonic) == 0.0, uptime
        assert graces.steps_seen == 1, uptime


def test_drift_is_allowed_per_interval() -> None:
    """A clock that gains 0.1% over each interval (NTP's slew stays under half of that)
    is not a step, however long the process runs."""
    graces = started()
    store, monotonic = 1000.0, 10.0
    for _ in range(1000):
        store, monotonic = store + 2.0 * 1.0009, monotonic + 2.0
        graces.witness(store, before=monotonic, after=monotonic)
    assert graces.steps_seen == 0


def test_a_backward_step_of_any_size_is_a_step() -> None:
    """The store's clock going back between two readings is a step even when it is far
    under the forward tolerance: a slewed clock never goes back."""
    graces = started()
    graces.witness(1001.7, before=12.0, after=12.0)  # 2 s passed, the store says 1.7
    assert graces.steps_seen == 1
    graces.witness(1003.69, before=14.0, after=14.0)  # a further 2 s, 1.99: 10 ms back
    assert graces.steps_seen == 2


def test_a_short_backward_step_seen_only_by_a_decision_is_a_step() -> None:
    """A step back of an hour that lasted less than the periodic interval is seen by the
    claim that read the clock during it, and by the reading after it: the grace then
    counts from the last step, not from the hour-old moment the claim wrote."""
    graces = started()
    graces.witness(1010.0, before=20.0, after=20.0)  # periodic
    claimed = 1010.5 - 3600.0
    graces.witness(claimed, before=20.4, after=20.6)  # the claim, during the step
    assert graces.steps_seen == 1
    # The clock is right again; a probe's release check 10 s later reads it.
    assert counted(graces, claimed + 30.0, 1021.0, 31.0) <= 10.4
    assert graces.steps_seen == 2


def test_a_slow_read_is_not_a_step() -> None:
    """A store read that took two seconds is bounded by the monotonic readings around it:
    the clocks kept pace, so nothing restarts."""
    graces = started()
    graces.witness(1051.0, before=60.0, after=62.0)
    assert graces.steps_seen == 0
    assert counted(graces, 1000.0, 1300.0, 310.0) == 300.0


def test_a_new_process_carries_on_from_a_recent_trail() -> None:
    """A process of the same boot that starts within the trail gap, its first reading in
    step with the trail's latest witness, counts from the trail's trusted start."""
    before = started(store_now=1000.0, monotonic=10.0)
    before.witness(1050.0, before=60.0, after=60.0)
    after = started(store_now=1055.0, monotonic=65.0)  # restarted 5 s later
    assert after.adopt(before.record())
    assert counted(after, 1001.0, 1060.0, 70.0) == 59.0


def test_a_trail_is_refused_across_a_gap_a_step_or_garbage() -> None:
    """No trail is adopted after a long gap, across a step between the two processes, after
    a step this process saw, or from bytes that are not a witness."""
    before = started(store_now=1000.0, monotonic=10.0)
    trail = before.record()
    assert not started(store_now=1100.0, monotonic=110.0).adopt(trail)  # 100 s without one
    assert not started(store_now=1605.0, monotonic=15.0).adopt(trail)  # stepped +10 min
    stepped = started(store_now=1005.0, monotonic=15.0)
    stepped.witness(1700.0, before=16.0, after=16.0)
    assert not stepped.adopt(trail)
    assert not started().adopt(b"not json")
    assert not started().adopt(b'{"latest": 1}')


def test_a_sibling_that_wrote_after_this_process_started_is_a_trail_too() -> None:
    """A live sibling worker's witness, written after this process's first reading, is
    adopted when the two agree."""
    sibling = started(store_now=1000.0, monotonic=10.0)
    sibling.witness(1030.0, before=40.0, after=40.0)
    here = started(store_now=1025.0, monotonic=35.0)
    assert here.adopt(sibling.record())
    assert counted(here, 1000.0, 1040.0, 50.0) == 40.0


def test_a_backward_step_leaves_the_clock_unsettled_until_it_comes_back() -> None:
    """After a step back, new records are not dated on the clock (a process that has not
    read it since would take them for an hour old) until a witness sees it come back."""
    clock = StoppedClock(10.0)
    graces = GraceClock(clock)
    graces.witness(1000.0, before=10.0, after=10.0)
    assert not graces.unsettled()
    clock.now = 11.0
    graces.witness(1001.0 - 3600.0, before=11.0, after=11.0)
    assert graces.unsettled()
    clock.now = 12.0
    graces.witness(1002.0, before=12.0, after=12.0)  # forward again
    assert not graces.unsettled()
    assert graces.steps_seen == 2


def test_a_backward_step_that_lasts_settles_once_every_process_has_read_it() -> None:
    """A step back that stays (an operator set the clock right) is unsettled for `SETTLE`
    seconds only: by then every live process's periodic witness has seen it."""
    clock = StoppedClock(10.0)
    graces = GraceClock(clock)
    graces.witness(1000.0, before=10.0, after=10.0)
    graces.witness(700.0, before=11.0, after=11.0)  # five minutes back, for good
    clock.now = 11.0 + SETTLE - 0.01
    assert graces.unsettled()
    clock.now = 11.0 + SETTLE
    assert not graces.unsettled()


async def test_settled_returns_when_the_clock_comes_back() -> None:
    """A claim waiting for a settled clock goes on at the witness that sees it come back,
    not at the end of `SETTLE`."""
    clock = StoppedClock(10.0)
    graces = GraceClock(clock)
    graces.witness(1000.0, before=10.0, after=10.0)
    graces.witness(1000.5 - 3600.0, before=10.5, after=10.5)
    waiting = asyncio.create_task(graces.settled())
    await asyncio.sleep(0)
    assert not waiting.done()
    graces.witness(1001.0, before=11.0, after=11.0)
    await asyncio.wait_for(waiting, timeout=SETTLE)
    assert not graces.unsettled()


def test_a_process_that_starts_while_the_clock_is_back_sees_the_step() -> None:
    """Its first reading is earlier than one another process already took and wrote: a
    backward step, though this process saw none of its own; unsettled as any other."""
    clock = StoppedClock(50.0)
    other = started(store_now=1000.0, monotonic=10.0)
    other.witness(1030.0, before=40.0, after=40.0)
    here = GraceClock(clock)
    here.witness(1035.0 - 3600.0, before=50.0, after=50.0)  # starts during the step
    here.compare_with([other.record() or b"", b"garbage"])
    assert here.steps_seen == 1
    assert here.unsettled()


def test_a_process_that_starts_on_a_steady_clock_sees_no_step() -> None:
    """Readings others took before (in the past by the store's clock) are no step."""
    clock = StoppedClock(50.0)
    other = started(store_now=1000.0, monotonic=10.0)
    here = GraceClock(clock)
    here.witness(1040.0, before=50.0, after=50.0)
    here.compare_with([other.record() or b"", b'{"latest": "x"}'])
    assert here.steps_seen == 0
    assert not here.unsettled()


def test_readings_far_apart_do_not_vouch_for_the_clock_between_them() -> None:
    """A process paused across two steps back (the clock came back between them) reads
    the stepped clock before and after: the two agree, yet its new reading is an hour
    early. Past `UNWATCHED_GAP` it is unsettled until the others' witnesses vouch for it,
    and they show it is behind."""
    clock = StoppedClock(10.0)
    here = GraceClock(clock)
    here.witness(1000.0 - 3600.0, before=10.0, after=10.0)  # read during the first step
    clock.now = 21.0
    here.witness(1011.0 - 3600.0, before=21.0, after=21.0)  # woke up during the second
    assert here.steps_seen == 0
    assert here.rejoining
    assert here.unsettled()
    other = started(store_now=1000.0, monotonic=10.0)
    other.witness(1020.0, before=30.0, after=30.0)  # another process, on the right clock
    here.compare_with([other.record() or b""])
    assert not here.rejoining
    assert here.steps_seen == 1
    assert here.unsettled()


def test_a_gap_that_the_others_vouch_for_settles_at_once() -> None:
    """After a pause on a steady clock, the check against the others' witnesses ends the
    wait: claims go on without waiting out `SETTLE`."""
    clock = StoppedClock(10.0)
    here = GraceClock(clock)
    here.witness(1000.0, before=10.0, after=10.0)
    clock.now = 10.0 + UNWATCHED_GAP + 1.0
    here.witness(1000.0 + UNWATCHED_GAP + 1.0, before=clock.now, after=clock.now)
    assert here.unsettled()
    other = started(store_now=1002.0, monotonic=12.0)
    here.compare_with([other.record() or b""])
    assert not here.unsettled()
    assert here.steps_seen == 0


def test_readings_within_the_gap_need_no_check() -> None:
    """The periodic witnesses, `WITNESS_INTERVAL` apart, never ask for a check."""
    clock = StoppedClock(10.0)
    here = GraceClock(clock)
    for second in range(10, 30, 2):
        clock.now = float(second)
        here.witness(990.0 + second, before=clock.now, after=clock.now + 0.1)
    assert not here.rejoining
    assert not here.unsettled()


class WitnessRows:
    """The store as `start_witness` sees it: a clock the test sets, and the hosts' rows."""

    def __init__(self, now: float, rows: dict[str, bytes]) -> None:
        self.store_now = now
        self.rows = rows
        self.reads = 0
        self.read = asyncio.Event()

    async def now(self) -> float:
        return self.store_now

    async def read_clock_witnesses(self) -> dict[str, bytes]:
        self.reads += 1
        self.read.set()
        return dict(self.rows)

    async def write_clock_witness(self, host: str, witness: bytes) -> None:
        self.rows[host] = witness


async def test_a_gateway_that_starts_while_the_clock_is_back_does_not_trust_it() -> None:
    """`start_witness` checks the first reading against every host's row before the
    gateway serves: an hour behind another host's latest reading is a step."""
    other = started(store_now=1000.0, monotonic=10.0)
    store = WitnessRows(1001.0 - 3600.0, {"boot-b": other.record() or b""})
    graces = GraceClock(SystemClock())
    task = await start_witness(store, graces, host="boot-a", interval=3600.0)
    task.cancel()
    assert graces.steps_seen == 1
    assert graces.unsettled()
    assert set(store.rows) == {"boot-a", "boot-b"}


async def test_a_gateway_back_from_a_pause_checks_the_clock_again() -> None:
    """A periodic witness that finds more than `UNWATCHED_GAP` since the last reading
    reads the hosts' rows again: two readings on a stepped clock, before and after the
    pause, agree, but another host read a later time meanwhile."""
    clock = StoppedClock(10.0)
    store = WitnessRows(1000.0 - 3600.0, {})
    graces = GraceClock(clock)
    task = await start_witness(store, graces, host=None, interval=0.001)
    try:
        assert store.reads == 1
        assert graces.steps_seen == 0
        other = started(store_now=1015.0, monotonic=25.0)
        store.rows["boot-b"] = other.record() or b""
        store.read.clear()
        clock.now, store.store_now = 20.0, 1010.0 - 3600.0  # paused 10 s, stepped again
        await asyncio.wait_for(store.read.wait(), timeout=10)
        assert store.reads == 2
        assert graces.steps_seen == 1
        assert graces.unsettled()
    finally:
        task.cancel()
