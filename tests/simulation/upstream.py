"""A scripted upstream: every send and probe waits until the simulator decides its fate.

The world side (`ScriptedUpstream`) is shared by all replicas and is the
ground truth the invariants count: every effect it applied (per forwarded
key, which is the operation id with `forward_key = "operation_id"`), every
answer it gave, every probe it answered. Each replica talks to it through a
`ReplicaUpstream`, the `gateway.engine.exchange.Upstream` its engine and prober are
given, which also stops a paused replica from sending or receiving.

A send arrives "at the door" and stays there until the simulator either
refuses the connection (`UpstreamUnreachable`: provably nothing was sent) or
lets it in. Once in, its effect is applied now, later, or never, and its
answer is given now or later, or the connection drops or times out. The
upstream is honest: it answers a 2xx only for an applied effect, a refusal
(429) or an error (500) only when it did not and will not apply, and it
never applies a request later than `not_applied_after` after the later of
(the attempt's first lease expiry plus the route's whole-call limit, its
`timeout`: the latest send may take that long) and (the attempt's last lease
expiry): the bound the gateway's release window relies on, in world time
(a lease the store wrote while its clock was stepped is taken at the world
time it meant). A request that reaches it later than that is not applied.

Probes are answered truthfully at the moment they are answered: 200 with a
body naming the effect when one exists for the operation, 404 otherwise;
but a probe blind to some requests (`blind`: their paths) never finds their
effects and answers 404 about them, as a tickets lookup says nothing about
emails. A probe about an operation the store never held (calibration's
"a forwarded key never used") finds nothing, as a real one would.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal
from urllib.parse import parse_qs, urlsplit

from gateway.engine.errors import UpstreamConnectionLost, UpstreamTimeout, UpstreamUnreachable
from gateway.engine.fairness import Hold, RouteSlots
from gateway.engine.fingerprint import canonical_path
from gateway.engine.headers import IDEMPOTENCY_KEY, without
from tests.simulation.context import CALL

if TYPE_CHECKING:
    from gateway.config import RouteSettings
    from gateway.engine.headers import Pairs
    from tests.simulation.clock import ReplicaClock, WorldClock
    from tests.simulation.memory_store import MemoryDatabase

__all__ = ["Effect", "ProbeCall", "ReplicaUpstream", "ScriptedUpstream", "SendCall", "SimAnswer"]

Answer = tuple[int, tuple[tuple[str, str], ...], bytes]
"""(status, headers as the gateway keeps them, body)."""

REDACTED = frozenset({"set-cookie"})


@dataclass(slots=True)
class Effect:
    number: int
    operation_id: str
    attempt: int
    send: int
    at: float
    path: str = ""
    """The request's path (canonical, as `SendCall.path`): what a blind probe cannot see."""


@dataclass(slots=True)
class SendCall:
    """One request a replica sent: its place at the door, its effect, its answer."""

    number: int
    replica: str
    operation_id: str
    attempt: int
    token: int
    body: bytes
    fingerprint: str | None
    """The record's fingerprint when the send was attributed (None: no record)."""
    called_at: float
    future: asyncio.Future[SimAnswer] = field(repr=False)
    path: str = ""
    """The URL's path, canonical (escapes of unreserved characters decoded)."""
    raw_path: str = ""
    """The URL's path as sent (what the request's fingerprint was computed from)."""
    query: str = ""
    content_type: str | None = None
    departed: bool = False
    """False while the sending replica is paused before the first byte left."""
    phase: Literal["door", "in", "refused"] = "door"
    arrived_at: float | None = None
    effect: Literal["pending", "applied", "never"] = "pending"
    apply_by: float | None = None
    """Scheduled late apply (world time), when the simulator chose one."""
    reply: Literal["pending", "answered", "dropped", "timed_out", "refused", "orphaned"] = "pending"
    status: int | None = None
    """The status the upstream answered with, once it answered."""

    @property
    def label(self) -> str:
        return f"S{self.number}({self.replica} {self.operation_id[-4:]}#{self.attempt})"


@dataclass(slots=True)
class ProbeCall:
    """One probe a replica sent, and the answer it got (if any)."""

    number: int
    replica: str
    operation_id: str
    token: int | None
    attempt: int | None
    requested_at: float
    future: asyncio.Future[SimAnswer] = field(repr=False)
    answered_at: float | None = None
    status: int | None = None
    effects_seen: int | None = None
    outcome: Literal["pending", "answered", "failed", "orphaned"] = "pending"

    known: bool = True
    """False for an operation the store never held (a calibration's unused key, whose id
    is random: never in a trace line)."""

    @property
    def label(self) -> str:
        about = self.operation_id[-4:] if self.known else "unused key"
        return f"P{self.number}({self.replica} {about})"


class SimAnswer:
    """`gateway.engine.exchange.UpstreamAnswer` for a scripted answer.

    `cut` makes the body never arrive whole (the connection drops mid-body),
    which leaves the effect ambiguous to the gateway.
    """

    def __init__(self, status: int, headers: Pairs, body: bytes, *, cut: bool = False) -> None:
        self.status = status
        self.headers = headers
        self._body = body
        self._cut = cut
        self._read_too_large = False
        self.closed = False

    async def read(self, limit: int) -> bytes | None:
        if len(self._body) > limit:
            self._read_too_large = True
            return None
        if self._cut:
            raise UpstreamConnectionLost("the upstream connection dropped mid-body")
        return self._body

    async def rest(self) -> AsyncIterator[bytes]:
        half = len(self._body) // 2
        yield self._body[:half]
        if self._cut:
            raise UpstreamConnectionLost("the upstream connection dropped mid-body")
        yield self._body[half:]

    def close(self) -> None:
        self.closed = True


class ScriptedUpstream:
    """The world's upstream: ground truth of effects, answers and probes."""

    def __init__(
        self,
        world: WorldClock,
        db: MemoryDatabase,
        *,
        not_applied_after: float,
        whole_call: float,
        large_body: int,
        blind: frozenset[str] = frozenset(),
    ) -> None:
        self._world = world
        self._db = db
        self.not_applied_after = not_applied_after
        self.whole_call = whole_call
        """The route's whole-call limit (`timeout`): how long after its send a request
        may still be working upstream."""
        self.blind = blind
        """Request paths (canonical) whose effects the probe cannot see."""
        self._large_body = large_body
        self.sends: list[SendCall] = []
        self.probes: list[ProbeCall] = []
        self.effects: dict[str, list[Effect]] = {}
        self.answers: dict[str, list[Answer]] = {}
        self.probe_answers: dict[str, list[Answer]] = {}
        self.lease_expiry: dict[tuple[str, int], float] = {}
        """(operation id, attempt) -> its latest lease expiry, world time."""
        self.first_lease: dict[tuple[str, int], float] = {}
        """(operation id, attempt) -> the lease its claim granted, world time: the latest
        moment its holder may hand the request over."""
        self._history_seen = 0
        self._effect_count = 0
        self.received: dict[tuple[str, int], SendCall] = {}
        """Attempts (operation id, attempt number) that reached the upstream."""
        self.violations: list[str] = []
        """Invariant breaks only the upstream can see (a send of a released attempt)."""

    # -- what the invariants read ------------------------------------------------------

    def effect_count(self, operation_id: str) -> int:
        return len(self.effects.get(operation_id, ()))

    def bound(self, operation_id: str, attempt: int) -> float:
        """The latest world time this attempt may take effect: `not_applied_after` past the
        later of (its first lease expiry + the whole-call limit) and its last lease expiry."""
        self.follow_leases()
        key = (operation_id, attempt)
        last = self.lease_expiry.get(key, 0.0)
        first = self.first_lease.get(key, last)
        return max(first + self.whole_call, last) + self.not_applied_after

    def follow_leases(self) -> None:
        """Track every attempt's first and latest lease expiry (world time) from the
        database's history: each from the write that set it, taken off the store clock's
        offset at that write (a lease written during a step meant world time + lease)."""
        history = self._db.history
        for transition in history[self._history_seen :]:
            before, after = transition.before, transition.after
            if after is None or after.lease_expires_at is None:
                continue
            new_attempt = before is None or before.attempts != after.attempts
            kept = before is not None and before.lease_expires_at == after.lease_expires_at
            if kept and not new_attempt:
                continue  # kept from the write that set it, at that write's offset
            expiry = after.lease_expires_at - transition.offset
            key = (after.id, after.attempts)
            if new_attempt:
                self.first_lease.setdefault(key, expiry)
            if expiry > self.lease_expiry.get(key, 0.0):
                self.lease_expiry[key] = expiry
        self._history_seen = len(history)

    # -- requests ------------------------------------------------------------------------

    def arrive(
        self, replica: str, url: str, headers: Sequence[tuple[str, str]], body: bytes
    ) -> SendCall:
        """A replica sends: attributed to the attempt the store says is current right now."""
        op_id = next((v for n, v in headers if n.lower() == IDEMPOTENCY_KEY.lower()), "?")
        content_type = next((v for n, v in headers if n.lower() == "content-type"), None)
        parts = urlsplit(url)
        row = self._db.rows.get(op_id)
        call = SendCall(
            number=len(self.sends) + 1,
            replica=replica,
            operation_id=op_id,
            attempt=row.attempts if row is not None else 0,
            token=row.token if row is not None else 0,
            body=body,
            fingerprint=row.fingerprint if row is not None else None,
            called_at=self._world.now,
            future=asyncio.get_running_loop().create_future(),
            path=canonical_path(parts.path),
            raw_path=parts.path,
            query=parts.query,
            content_type=content_type,
        )
        self.sends.append(call)
        return call

    def depart(self, call: SendCall) -> None:
        call.departed, call.called_at = True, self._world.now

    def pending_at_door(self) -> list[SendCall]:
        return [s for s in self.sends if s.phase == "door" and s.departed and not s.future.done()]

    def effect_pending(self) -> list[SendCall]:
        return [s for s in self.sends if s.phase == "in" and s.effect == "pending"]

    def reply_pending(self) -> list[SendCall]:
        return [s for s in self.sends if s.phase == "in" and s.reply == "pending"]

    def refuse(self, call: SendCall) -> None:
        """Connection refused: nothing was sent, nothing will ever apply."""
        call.phase, call.effect, call.reply = "refused", "never", "refused"
        self._deliver_error(call, UpstreamUnreachable("connection refused (simulated)"))

    def let_in(self, call: SendCall) -> None:
        """The request reached the upstream; it may take effect from now until its bound."""
        call.phase, call.arrived_at = "in", self._world.now
        self.received.setdefault((call.operation_id, call.attempt), call)
        released = self._released_by_gateway(call)
        if released:
            self.violations.append(
                f"{call.label} reached the upstream although the gateway released attempt "
                f"{call.attempt} as never sent ({released})"
            )
        if self._world.now >= self.bound(call.operation_id, call.attempt):
            call.effect = "never"  # too late to apply: the upstream drops stale requests

    def _released_by_gateway(self, call: SendCall) -> str:
        for transition in self._db.history:
            before = transition.before
            if (
                transition.verb == "release"
                and before is not None
                and before.id == call.operation_id
                and before.attempts == call.attempt
            ):
                return f"history #{transition.number}"
        return ""

    def may_apply(self, call: SendCall) -> bool:
        return (
            call.phase == "in"
            and call.effect == "pending"
            and self._world.now < self.bound(call.operation_id, call.attempt)
        )

    def apply(self, call: SendCall) -> Effect | None:
        if not self.may_apply(call):
            if call.effect == "pending":
                call.effect = "never"
            return None
        self._effect_count += 1
        effect = Effect(
            self._effect_count,
            call.operation_id,
            call.attempt,
            call.number,
            self._world.now,
            call.path,
        )
        self.effects.setdefault(call.operation_id, []).append(effect)
        call.effect = "applied"
        return effect

    def never(self, call: SendCall) -> None:
        if call.effect == "pending":
            call.effect = "never"

    def answer(self, call: SendCall, *, status: int, large: bool, cut: bool, cookie: bool) -> None:
        """Give the answer an honest upstream gives for the effect as it stands."""
        effect = self.effects.get(call.operation_id, [])
        mine = [e for e in effect if e.send == call.number]
        if 200 <= status < 300:
            assert mine, "a 2xx is only for an applied effect"
            payload: dict[str, object] = {"effect": f"E{mine[0].number}", "ref": call.operation_id}
        else:
            assert not mine, "a refusal only for no effect"
            assert call.effect == "never", "a refusal only for an effect that will never be"
            payload = {"error": status, "ref": call.operation_id}
        if large:
            payload["padding"] = "x" * self._large_body
        body = json.dumps(payload, separators=(",", ":")).encode()
        headers: tuple[tuple[str, str], ...] = (
            ("content-type", "application/json"),
            ("x-send", str(call.number)),
        )
        if cookie:
            headers = (*headers, ("set-cookie", "session=secret"))
        if not cut:
            self.answers.setdefault(call.operation_id, []).append(
                (status, without(headers, REDACTED), body)
            )
        call.reply, call.status = "answered", status
        self._deliver(call, SimAnswer(status, headers, body, cut=cut))

    def drop(self, call: SendCall, *, timeout: bool) -> None:
        call.reply = "timed_out" if timeout else "dropped"
        error = (
            UpstreamTimeout("the upstream did not answer in time (simulated)")
            if timeout
            else UpstreamConnectionLost("the upstream connection dropped (simulated)")
        )
        self._deliver_error(call, error)

    def _deliver(self, call: SendCall | ProbeCall, answer: SimAnswer) -> None:
        if call.future.done():  # the replica died or the task was cancelled
            if isinstance(call, SendCall):
                call.reply = "orphaned"
            return
        call.future.set_result(answer)

    def _deliver_error(self, call: SendCall | ProbeCall, error: Exception) -> None:
        if not call.future.done():
            call.future.set_exception(error)

    # -- probes --------------------------------------------------------------------------

    def probe_arrives(self, replica: str, url: str) -> ProbeCall:
        refs = parse_qs(urlsplit(url).query).get("ref", ["?"])
        op_id = refs[0]
        row = self._db.rows.get(op_id)
        call = ProbeCall(
            number=len(self.probes) + 1,
            replica=replica,
            operation_id=op_id,
            token=row.token if row is not None else None,
            attempt=row.attempts if row is not None else None,
            requested_at=self._world.now,
            future=asyncio.get_running_loop().create_future(),
            known=op_id in self._db.seq or op_id in self.effects,
        )
        self.probes.append(call)
        return call

    def pending_probes(self) -> list[ProbeCall]:
        return [p for p in self.probes if p.outcome == "pending" and not p.future.done()]

    def visible(self, operation_id: str) -> list[Effect]:
        """The operation's effects the probe can see (not those of a blind request path)."""
        return [e for e in self.effects.get(operation_id, ()) if e.path not in self.blind]

    def answer_probe(self, call: ProbeCall, *, inconclusive: bool = False) -> None:
        """The truth at this moment, as far as the probe sees: 200 naming the effect if
        one it can see exists, else 404 (a blind probe's 404 may hide an effect)."""
        effects = self.visible(call.operation_id)
        call.answered_at, call.effects_seen = self._world.now, len(effects)
        if inconclusive:
            status, payload = 503, {"error": "try later"}
        elif effects:
            status, payload = 200, {"ref": call.operation_id, "effect": f"E{effects[-1].number}"}
        else:
            status, payload = 404, {"ref": call.operation_id, "effect": None}
        body = json.dumps(payload, separators=(",", ":")).encode()
        headers = (("content-type", "application/json"),)
        call.status, call.outcome = status, "answered"
        self.probe_answers.setdefault(call.operation_id, []).append((status, headers, body))
        if call.future.done():
            call.outcome = "orphaned"
            return
        call.future.set_result(SimAnswer(status, headers, body))

    def fail_probe(self, call: ProbeCall, *, unreachable: bool) -> None:
        call.outcome = "failed"
        error: Exception = (
            UpstreamUnreachable("probe: connection refused (simulated)")
            if unreachable
            else UpstreamConnectionLost("probe: connection dropped (simulated)")
        )
        self._deliver_error(call, error)


class ReplicaUpstream:
    """`gateway.engine.exchange.Upstream` for one replica: its gates, its pauses, its probes."""

    def __init__(
        self, world: ScriptedUpstream, *, replica: str, clock: ReplicaClock, probe_path: str
    ) -> None:
        self._world = world
        self._replica = replica
        self._clock = clock
        self._probe_prefix = probe_path.split("?", 1)[0]
        self._slots: dict[str, RouteSlots] = {}

    def gate(self, route: RouteSettings, scope: str) -> Hold:
        slots = self._slots.get(route.name)
        if slots is None:
            slots = self._slots[route.name] = RouteSlots(route.name, route.max_concurrency)
        return slots.hold(scope)

    async def send(
        self,
        route: RouteSettings,
        method: str,
        url: str,
        headers: Sequence[tuple[str, str]],
        body: bytes,
    ) -> SimAnswer:
        is_probe = method == "GET" and urlsplit(url).path.endswith(self._probe_prefix)
        if is_probe:
            await self._clock.resumed()  # a paused process sends nothing
            probe = self._world.probe_arrives(self._replica, url)
            answer = await probe.future
            await self._clock.resumed()  # ... and reads nothing
            call = CALL.get()
            if call is not None:
                call.probe = probe
                call.probes[probe.operation_id] = probe
            return answer
        # Attributed before a pause: the attempt the engine checked its lease for.
        sent = self._world.arrive(self._replica, url, headers, body)
        await self._clock.resumed()
        self._world.depart(sent)
        try:
            answer = await sent.future
        except asyncio.CancelledError:
            raise
        except BaseException:
            await self._received(sent)  # a paused process learns of the failure on resuming
            raise
        await self._received(sent)
        return answer

    async def _received(self, sent: SendCall) -> None:
        call = CALL.get()
        if call is not None:
            call.send = sent
        await self._clock.resumed()
