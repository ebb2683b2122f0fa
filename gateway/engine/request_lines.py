"""The key's request log: every request that carried a key, a line each, with its operation.

An operation's history says what happened to the effect; it says nothing of the
agent that kept retrying, of the 422 a reused key got, or of which of an agent's
request ids the gateway answered from a receipt. Stripe shows every request of a
key; so does this, bounded: the first `FIRST` lines of an operation and the
last `LAST` are kept, with counts of all of them (total, replays, refusals).

Recording never slows an answer: a line goes into a buffer here, and the buffer
is written at most once a second (`INTERVAL`) by a task of its own, off the
replay path. Lines of one operation within one interval are coalesced after its
first `FIRST`: only the newest `LAST` of the rest are written, the others counted. A gateway
killed between two writes loses at most one interval of lines (never an
effect's record: the history and the receipt are written with the outcome).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gateway.engine.errors import StoreUnavailable
from gateway.engine.history import iso, micros

if TYPE_CHECKING:
    from gateway.store.base import Store

__all__ = [
    "FIRST",
    "INTERVAL",
    "LAST",
    "LOGGED_OUTCOMES",
    "RequestBatch",
    "RequestLine",
    "RequestLog",
    "RequestRecorder",
    "numbered",
]

log = logging.getLogger("gateway.requests")

FIRST = 20
"""Lines kept from the start of an operation's log: how it began."""
LAST = 80
"""Lines kept from its end: what the agent is doing now."""
LOGGED_OUTCOMES = (
    "forwarded",
    "replayed",
    "released",
    "in_progress",
    "unknown",
    "mismatch",
    "rejected",
)
"""The outcomes (the access log's) a line may have: the key's own operation answered, or
refused, the request (`similar` names another key's operation, `passthrough` none)."""

INTERVAL = 1.0
"""Seconds between two writes of the buffer."""
MAX_PENDING_OPERATIONS = 10_000
"""Operations with lines waiting in the buffer; lines of others are dropped (and said)."""


@dataclass(frozen=True, slots=True)
class RequestLine:
    """One request that carried a key: what the gateway answered, never what was sent."""

    at: float
    request_id: str
    status: int
    outcome: str
    """One of `LOGGED_OUTCOMES`."""
    replayed: bool
    problem: str | None
    """The problem type's name when the answer was one (`key-mismatch`), else None."""

    @property
    def refusal(self) -> bool:
        """Answered 4xx by the gateway itself: not sent, not a replay."""
        return not self.replayed and 400 <= self.status < 500

    def as_json(self, seq: int) -> dict[str, Any]:
        return {
            "seq": seq,
            "request_id": self.request_id,
            "at": iso(micros(self.at)),
            "status": self.status,
            "outcome": self.outcome,
            "replayed": self.replayed,
            "problem": self.problem,
        }


@dataclass(slots=True)
class RequestBatch:
    """An operation's lines of one interval: its first `FIRST` and its newest `LAST`
    after those, and counts of them all (the ones between are only counted)."""

    operation_id: str
    head: list[RequestLine] = field(default_factory=list)
    tail: collections.deque[RequestLine] = field(
        default_factory=lambda: collections.deque(maxlen=LAST)
    )
    total: int = 0
    replays: int = 0
    refusals: int = 0

    def add(self, line: RequestLine) -> None:
        if len(self.head) < FIRST:
            self.head.append(line)
        else:
            self.tail.append(line)
        self.total += 1
        self.replays += line.replayed
        self.refusals += line.refusal


@dataclass(frozen=True, slots=True)
class RequestLog:
    """What a store keeps of an operation's log: its lines (by `seq`) and the counts."""

    lines: tuple[tuple[int, RequestLine], ...] = ()
    total: int = 0
    replays: int = 0
    refusals: int = 0

    def counts(self) -> dict[str, int]:
        return {"total": self.total, "replays": self.replays, "refusals": self.refusals}

    def as_json(self) -> dict[str, Any]:
        return {
            "items": [line.as_json(seq) for seq, line in self.lines],
            **self.counts(),
            "omitted": self.total - len(self.lines),
        }


def numbered(batch: RequestBatch, *, total: int) -> list[tuple[int, RequestLine]]:
    """The batch's lines with their `seq`, given the operation's count after it: the head
    numbered on from the count before, the tail up to the count after; lines the batch
    coalesced away took the numbers between.

    >>> batch = RequestBatch("op_1")
    >>> for n in range(FIRST + LAST + 5):
    ...     batch.add(RequestLine(0.0, f"r{n}", 201, "replayed", True, None))
    >>> lines = numbered(batch, total=1000 + FIRST + LAST + 5)
    >>> [(seq, line.request_id) for seq, line in (lines[0], lines[FIRST - 1], lines[FIRST])]
    [(1001, 'r0'), (1020, 'r19'), (1026, 'r25')]
    >>> lines[-1][0]
    1105
    """
    before = total - batch.total
    head = list(enumerate(batch.head, start=before + 1))
    return head + list(enumerate(batch.tail, start=total - len(batch.tail) + 1))


class RequestRecorder:
    """Buffers request lines and writes them at most once every `interval` seconds."""

    def __init__(self, store: Store, *, interval: float = INTERVAL) -> None:
        self._store = store
        self._interval = interval
        self._pending: dict[str, RequestBatch] = {}
        self._dropped = 0
        self._task: asyncio.Task[None] | None = None

    def add(self, operation_id: str, line: RequestLine) -> None:
        """Note a line; never waits."""
        batch = self._pending.get(operation_id)
        if batch is None:
            if len(self._pending) >= MAX_PENDING_OPERATIONS:
                self._dropped += 1
                return
            batch = self._pending[operation_id] = RequestBatch(operation_id)
        batch.add(line)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="request-log")

    async def stop(self) -> None:
        """Write what is pending, once, and stop."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await self.write_once()

    async def write_once(self) -> int:
        """Write the buffer; the number of operations written to."""
        pending, self._pending = self._pending, {}
        dropped, self._dropped = self._dropped, 0
        if dropped:
            log.warning(
                "request log: %d lines dropped (more than %d operations waited in one second)",
                dropped,
                MAX_PENDING_OPERATIONS,
                extra={"event": "request_log_dropped", "dropped": dropped},
            )
        if not pending:
            return 0
        try:
            await self._store.append_request_lines(list(pending.values()))
        except StoreUnavailable as exc:  # lines are not an effect's record: said, not retried
            log.warning(
                "request log: %d operations' lines not written: %s",
                len(pending),
                exc,
                extra={"event": "request_log_failed"},
            )
            return 0
        return len(pending)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            await self.write_once()
