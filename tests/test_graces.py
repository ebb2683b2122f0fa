"""`GraceClock`: the time counted for a grace that releases a key is never more than
really passed, whatever the store's clock does."""

from __future__ import annotations

from gateway.engine.clock import SystemClock
from gateway.engine.graces import GraceClock


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
