"""The registry cancellations are matched against, the background decision on each
cancellation, and the supervisor channel that shares the registry between workers."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

import pytest

from gateway.mcp.cancellations import Cancellations
from gateway.mcp.known_calls import Known, KnownCalls, call_name
from gateway.workers.channel import Outbox


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Wire:
    """Two workers' registries joined as the supervisor joins them: each announcement of
    one reaches the other (when `deliver` is called, so a test decides when)."""

    def __init__(self) -> None:
        self.pending: list[tuple[Callable[[str, bool], None], str, bool]] = []
        self.listeners: list[Callable[[str, bool], None]] = []
        self.sent: list[str] = []

    def end(self) -> WireEnd:
        return WireEnd(self)

    def deliver(self) -> None:
        pending, self.pending = self.pending, []
        for listener, call, started in pending:
            listener(call, started)


class WireEnd:
    def __init__(self, wire: Wire) -> None:
        self.wire = wire
        self.listener: Callable[[str, bool], None] | None = None

    def announce_call(self, call: str, *, started: bool) -> None:
        self.wire.sent.append(call)
        for listener in self.wire.listeners:
            if listener is not self.listener:
                self.wire.pending.append((listener, call, started))

    def listen_calls(self, on_call: Callable[[str, bool], None]) -> None:
        self.listener = on_call
        self.wire.listeners.append(on_call)


NAME = call_name("scope", None, 7)


def test_a_name_is_a_digest_of_scope_session_and_request_id() -> None:
    """Names differ by scope, session and id (its JSON type too) and never show the scope."""
    names = {
        call_name("scope", None, 7),
        call_name("other", None, 7),
        call_name("scope", "session", 7),
        call_name("scope", None, "7"),
        call_name("scope", None, 8),
    }
    assert len(names) == 5
    assert all(len(name) == 32 and "scope" not in name for name in names)
    assert call_name("scope", None, 7) == NAME


def test_a_name_is_known_while_handled_and_for_a_while_after() -> None:
    """Known from the start of its handling until `kept` seconds after its end."""
    clock = FakeClock()
    calls = KnownCalls(kept=10.0, clock=clock)
    assert calls.known(NAME) is None
    with calls.handling(NAME, protected=True):
        clock.now += 3600
        assert calls.known(NAME) is Known.PROTECTED
    clock.now += 9.9
    assert calls.known(NAME) is Known.PROTECTED
    clock.now += 0.2
    assert calls.known(NAME) is None
    assert len(calls) == 0


def test_once_protected_a_name_stays_protected() -> None:
    """An id reused by a protected call is matched as protected, whatever came first."""
    calls = KnownCalls()
    calls.started(NAME, protected=False)
    assert calls.known(NAME) is Known.UNPROTECTED
    calls.started(NAME, protected=True)
    calls.ended(NAME)
    calls.started(NAME, protected=False)
    assert calls.known(NAME) is Known.PROTECTED


def test_a_name_handled_again_is_not_forgotten_by_its_first_end() -> None:
    """The forgetting scheduled by an earlier end does not forget a name handled again."""
    clock = FakeClock()
    calls = KnownCalls(kept=10.0, clock=clock)
    with calls.handling(NAME, protected=True):
        pass
    clock.now += 5
    calls.started(NAME, protected=True)
    clock.now += 60
    assert calls.known(NAME) is Known.PROTECTED


def test_ended_names_are_bounded() -> None:
    """Past `max_ended` ended names, the oldest are forgotten first; running ones never."""
    calls = KnownCalls(kept=10.0, max_ended=100, clock=FakeClock())
    running = call_name("scope", None, "running")
    calls.started(running, protected=True)
    for n in range(1000):
        with calls.handling(call_name("scope", None, n), protected=False):
            pass
    assert len(calls) == 101
    assert calls.known(call_name("scope", None, 0)) is None
    assert calls.known(call_name("scope", None, 999)) is Known.UNPROTECTED
    assert calls.known(running) is Known.PROTECTED


def test_workers_learn_each_others_names_by_digest() -> None:
    """A name started on one worker is known on the other once announced, kind included,
    and forgotten there after its end; only digests cross the wire."""
    clock = FakeClock()
    wire = Wire()
    here, there = KnownCalls(clock=clock), KnownCalls(clock=clock)
    here.share(wire.end())
    there.share(wire.end())
    here.started(NAME, protected=True)
    assert there.known(NAME) is None  # not announced yet: the race a hold covers
    wire.deliver()
    assert there.known(NAME) is Known.PROTECTED
    here.ended(NAME)
    wire.deliver()
    clock.now += 60
    assert there.known(NAME) is None
    assert all(call[1:] == NAME for call in wire.sent)


def test_an_unreadable_announcement_is_ignored() -> None:
    """Announcements of another shape (e.g. from an older gateway) change nothing."""
    calls = KnownCalls()
    calls._heard('["scope", "", "7"]', True)
    calls._heard("X" + NAME, True)
    calls._heard("Pshort", True)
    assert len(calls) == 0


async def test_a_waiter_is_woken_by_the_announcement_not_by_the_clock() -> None:
    """`until_known` returns as soon as the name is announced, well within its limit."""
    wire = Wire()
    here, there = KnownCalls(), KnownCalls()
    here.share(wire.end())
    there.share(wire.end())
    waiting = asyncio.create_task(there.until_known(NAME, 3600))
    await asyncio.sleep(0)
    here.started(NAME, protected=False)
    wire.deliver()
    async with asyncio.timeout(10):
        await waiting
    assert there.known(NAME) is Known.UNPROTECTED
    assert not there._waiters


async def test_a_waiter_gives_up_after_its_limit() -> None:
    """A name nobody announces: `until_known` returns after its limit, leaving no waiter."""
    calls = KnownCalls()
    await calls.until_known(NAME, 0.01)
    assert calls.known(NAME) is None
    assert not calls._waiters


class Forwards:
    """A stand-in for the forward of a cancellation: counts, and says when one happened."""

    def __init__(self) -> None:
        self.count = 0
        self.happened = asyncio.Event()

    async def __call__(self) -> None:
        self.count += 1
        self.happened.set()


async def test_a_cancellation_of_an_unprotected_call_is_forwarded_at_once() -> None:
    """Known as unprotected: forwarded without waiting for the hold."""
    calls = KnownCalls()
    cancellations = Cancellations(calls)
    calls.started(NAME, protected=False)
    forwards = Forwards()
    assert not cancellations.dropped_at_once(NAME, route="tools")
    cancellations.decide(NAME, hold=3600, forward=forwards, route="tools")
    async with asyncio.timeout(10):
        await forwards.happened.wait()
    assert forwards.count == 1


async def test_a_held_cancellation_is_dropped_when_its_protected_call_is_announced() -> None:
    """Unknown at first, then announced as protected: never forwarded."""
    calls = KnownCalls()
    cancellations = Cancellations(calls)
    forwards = Forwards()
    cancellations.decide(NAME, hold=3600, forward=forwards, route="tools")
    await asyncio.sleep(0)
    assert len(cancellations) == 1
    held = list(cancellations._tasks)
    calls.started(NAME, protected=True)
    async with asyncio.timeout(10):
        await asyncio.gather(*held)
    assert len(cancellations) == 0
    assert forwards.count == 0
    assert cancellations.dropped_at_once(NAME, route="tools")


async def test_a_cancellation_nobody_claims_is_forwarded_after_the_hold() -> None:
    """A name never announced: forwarded once the hold has passed."""
    cancellations = Cancellations(KnownCalls())
    forwards = Forwards()
    loop = asyncio.get_running_loop()
    started = loop.time()
    cancellations.decide(NAME, hold=0.05, forward=forwards, route="tools")
    async with asyncio.timeout(10):
        await forwards.happened.wait()
    assert loop.time() - started >= 0.05
    assert forwards.count == 1


async def test_held_cancellations_are_bounded_and_dropped_at_shutdown(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Past the limit a cancellation is dropped (logged); `close` drops the held ones."""
    cancellations = Cancellations(KnownCalls(), limit=3)
    forwards = Forwards()
    for n in range(5):
        cancellations.decide(call_name("s", None, n), hold=3600, forward=forwards, route="t")
    assert len(cancellations) == 3
    shed = [r for r in caplog.records if getattr(r, "event", None) == "mcp_cancel_shed"]
    assert len(shed) == 1  # the second drop within the second is counted, not logged
    await cancellations.close()
    assert len(cancellations) == 0
    assert forwards.count == 0


class SteppedClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_one_tenant_cannot_take_every_held_cancellation(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Security review ("secrets stay secret", finding 8): held cancellations were capped
    per worker only, so one tenant's flood shed everyone else's, and each drop logged a
    warning. A tenant now holds at most its own cap; the others still get theirs; drops
    are logged at most once a second, with how many were dropped."""
    clock = SteppedClock()
    cancellations = Cancellations(KnownCalls(), limit=100, per_scope=10, clock=clock)
    forwards = Forwards()
    for n in range(1000):
        cancellations.decide(
            call_name("flood", None, n), hold=3600, forward=forwards, route="t", scope="flood"
        )
    cancellations.decide(
        call_name("other", None, 1), hold=3600, forward=forwards, route="t", scope="other"
    )
    assert len(cancellations) == 11  # the flood's 10, and the other tenant's one
    shed = [r for r in caplog.records if getattr(r, "event", None) == "mcp_cancel_shed"]
    assert [r.dropped for r in shed] == [1]
    clock.now = 1.5
    cancellations.decide(
        call_name("flood", None, 1001), hold=3600, forward=forwards, route="t", scope="flood"
    )
    shed = [r for r in caplog.records if getattr(r, "event", None) == "mcp_cancel_shed"]
    assert [r.dropped for r in shed] == [1, 990]
    await cancellations.close()
    assert forwards.count == 0


async def test_the_outbox_keeps_what_a_full_socket_buffer_refuses() -> None:
    """Announcements sent faster than the peer reads are queued and all arrive, in order."""
    sender, receiver = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    with sender, receiver:
        sender.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        sender.setblocking(False)
        receiver.setblocking(False)
        outbox = Outbox(sender)
        sent = [f"C{n:05d}".encode() for n in range(2000)]
        for datagram in sent:
            outbox.send(datagram)
        assert outbox._waiting  # the buffer filled: some are queued
        received: list[bytes] = []
        async with asyncio.timeout(10):
            while len(received) < len(sent):
                try:
                    received.append(receiver.recv(64))
                except BlockingIOError:
                    await asyncio.sleep(0.001)
        assert received == sent
        outbox.close()
