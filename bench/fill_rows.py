"""Rows of realistic stored operations, for filling a store with millions of them fast.

A day of a busy tool's traffic is mostly completed calls, with some released
(the upstream said no, so the key is free again) and a few unknown (the
gateway could not tell whether the effect happened). Each operation row comes
with what the gateway writes beside it: its history events (the claim with the
recorded request, the send, the outcome) and its request log (a line per
request that carried the key, and the counts).

Building a row the way the gateway does (`gateway.engine` fingerprints, HMAC
chains, ULIDs) costs about 280 us of Python, so ten million would take most
of an hour. Only the first `exact` rows are built that way: their keys are
`fill_key(i)`, their fingerprints match `fill_body`, their histories verify,
so a benchmark may replay them or look them up. Every other row is a copy of
an exact row of its state with its own random key, id, fingerprint and
digests of the same lengths: the same bytes on disk and the same spread over
every index (random keys and fingerprints, ids in time order), made in about
10 us. Their histories do not verify and their fingerprints match no body;
nothing reads them but the indexes.

Times are POSIX seconds; the writer turns them into its database's type.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import random
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.pool import AsyncResult

from gateway.engine.digests import Digests
from gateway.engine.fingerprint import fingerprint_request
from gateway.engine.history import NewEvent, chain, micros
from gateway.engine.ids import new_operation_id
from gateway.engine.lifecycle_events import (
    answered_event,
    claimed_event,
    released_event,
    request_claimed,
    sent_event,
    unknown_event,
)
from gateway.engine.recorded_request import http_record
from gateway.store.sqlite_schema import STORED_COLUMNS

__all__ = [
    "DAY",
    "FILL_SCOPE",
    "OPERATION_COLUMNS",
    "FilledOperation",
    "fill_body",
    "fill_key",
    "filled_operations",
    "made_in_parallel",
    "state_of",
]

FILL_SCOPE = "anonymous"
"""The scope of requests without `Authorization` (`gateway.engine.scopes.ANONYMOUS_SCOPE`)."""
DAY = 24 * 3600.0
SPAN = 1.01 * DAY
"""The fill's operations were created over the last `SPAN`: the oldest 1% are past the
default retention (a day), so a sweep has receipts to expire, as on a store in use."""
_ROUTE = "tickets"
_PATH = "/tickets/v1/issues"
_RECEIPT_BODY_SIZE = 300
_HEADERS = (
    '[["Content-Type","application/json; charset=utf-8"],'
    '["Date","Mon, 30 Nov 2026 06:05:20 GMT"],["Server","Python/3.11 aiohttp/3.14.5"]]'
)
_ULID_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_KIND = "POST /v1/issues"
"""The request kind stored with each claim (`gateway.engine.calibrator.request_kind`)."""

OPERATION_COLUMNS = (*STORED_COLUMNS, "request_kept", "request_kind")
"""The columns of a filled operation row, in order: both stores have them all."""


def fill_key(index: int) -> str:
    """The key of pre-filled operation `index`: UUID-shaped, like most agents' keys.

    >>> fill_key(0) == fill_key(0), len(fill_key(0))
    (True, 36)
    """
    return str(uuid.UUID(bytes=hashlib.blake2b(index.to_bytes(8, "big"), digest_size=16).digest()))


def fill_body(key: str) -> bytes:
    """The request body of the pre-filled operation with `key`: its own, as every
    operation's is (one body for all would be a million twins of one request).

    >>> fill_body("k-1")
    b'{"title":"benchmark ticket k-1"}'
    """
    return b'{"title":"benchmark ticket ' + key.encode() + b'"}'


def state_of(index: int) -> str:
    """The state of operation `index`: of every 50, one unknown, three released, the
    rest completed (2%, 6%, 92%).

    >>> [state_of(i) for i in range(5)]
    ['unknown', 'released', 'released', 'released', 'completed']
    """
    slot = index % 50
    return "unknown" if slot == 0 else "released" if slot <= 3 else "completed"


@dataclass(frozen=True, slots=True)
class FilledOperation:
    """One operation and the rows stored beside it, in the columns' order.

    `operation` follows `OPERATION_COLUMNS`; each event follows
    `EVENT_COLUMNS` (with `storage` after `payload`); `log` lines follow
    `request_log`'s columns; `counts` follows `request_counts`'.
    """

    operation: tuple[object, ...]
    events: tuple[tuple[object, ...], ...]
    log: tuple[tuple[object, ...], ...]
    counts: tuple[object, ...]


def filled_operations(
    first: int, end: int, total: int, digests: Digests, *, exact: int, now: float
) -> Iterator[FilledOperation]:
    """Operations `first..end-1` of `total`, created evenly over the `SPAN` before `now`.

    The newest `exact` are built as the gateway builds them, with keys
    `fill_key(0..exact-1)` (the newest, so that their receipts outlive a benchmark:
    the oldest expire as it runs, as on a real store); the others are copies with
    fresh identities (the module's docstring says why).
    """
    templates: dict[str, FilledOperation] = {}
    rng = random.Random(first)
    exact_from = total - min(exact, total)
    for index in range(first, end):
        created = now - SPAN + SPAN * (index + 1) / total
        if index >= exact_from:
            yield _exact_operation(index - exact_from, created, digests)
            continue
        state = state_of(index)
        template = templates.get(state)
        if template is None:
            template = templates[state] = _exact_operation(index, created, digests)
        yield _copy(template, index, created, rng)


Rows = list[tuple[object, ...]]


def made_in_parallel(
    total: int, secret: bytes, *, exact: int, chunk: int, now: float | None = None
) -> Iterator[tuple[Rows, Rows, Rows, Rows]]:
    """`filled_operations(0, total, ...)` with the store's `secret`, in chunks of `chunk`,
    in order, made by one process per core while the caller writes the chunks before them.
    Their `SPAN` ends at `now` (the current time when it is None).

    Each chunk is four lists (operations, events, request log lines, counts) of
    plain tuples: they cross between processes far cheaper than objects do.
    """
    now = time.time() if now is None else now
    jobs = [
        (start, min(total, start + chunk), total, secret, exact, now)
        for start in range(0, total, chunk)
    ]
    makers = os.cpu_count() or 1
    with multiprocessing.get_context("fork").Pool(makers) as pool:
        # A bounded read-ahead: `imap` hands out every job at once, and when the writer is
        # slower than the makers (a disk or a database busy elsewhere) the chunks made pile
        # up in this process (14 GB, and an OOM kill, for ten million beside another fill).
        ahead: deque[AsyncResult[tuple[Rows, Rows, Rows, Rows]]] = deque()
        for job in jobs:
            ahead.append(pool.apply_async(_made, (job,)))
            if len(ahead) > 2 * makers:
                yield ahead.popleft().get()
        while ahead:
            yield ahead.popleft().get()


def _made(job: tuple[int, int, int, bytes, int, float]) -> tuple[Rows, Rows, Rows, Rows]:
    first, end, total, secret, exact, now = job
    made = list(filled_operations(first, end, total, Digests(secret), exact=exact, now=now))
    return (
        [filled.operation for filled in made],
        [event for filled in made for event in filled.events],
        [line for filled in made for line in filled.log],
        [filled.counts for filled in made],
    )


def _exact_operation(index: int, created: float, digests: Digests) -> FilledOperation:
    """Operation `index` as the gateway would have stored it."""
    state = state_of(index)
    settled = created + 0.002
    key = fill_key(index)
    body = fill_body(key)
    fingerprint = digests.fingerprint(
        FILL_SCOPE,
        fingerprint_request(
            method="POST", route=_ROUTE, path=_PATH, query="",
            content_type="application/json", body=body,
        ),
    )  # fmt: skip
    request = http_record(
        method="POST",
        target=_PATH,
        content_type="application/json",
        body=body,
        limit=64 << 10,
        redact=(),
        digest=lambda kept: digests.body(FILL_SCOPE, kept),
    )
    operation_id = new_operation_id(created)
    outcome: NewEvent
    if state == "completed":
        outcome = answered_event(201, attempt=1)
    elif state == "released":
        outcome = released_event("the upstream answered 503 before acting", status=503)
    else:
        outcome = unknown_event("timed-out", "no answer within 30 s")
    claimed, head, _ = chain(
        operation_id, head="", seq=0, version=1, at_us=micros(created), attempt=1,
        events=(claimed_event(request_claimed(request), 1),),
    )  # fmt: skip
    settled_events, head, seq = chain(
        operation_id, head=head, seq=1, version=2, at_us=micros(settled), attempt=1,
        events=(sent_event(1, operation_id, attempt=1), outcome),
    )  # fmt: skip
    events = tuple((*row[:8], "plain", *row[8:]) for row in (*claimed, *settled_events))
    receipt = state == "completed"
    evidence = "[]"
    if state == "released":
        evidence = json.dumps(
            [{"at": settled, "source": "upstream", "detail": "503 before acting",
              "status": 503, "body_sha256": None}]
        )  # fmt: skip
    operation = (
        operation_id,  # id
        FILL_SCOPE,
        key,
        state,
        _ROUTE,
        "POST",
        _PATH,
        fingerprint,
        1,  # attempts
        1,  # token
        2,  # version: claimed, then settled
        created,  # created_at
        settled,  # updated_at
        None,  # lease_owner
        None,  # lease_expires_at
        created,  # sent_at
        201 if receipt else None,  # response_status
        _HEADERS if receipt else None,
        _receipt_body(index, key) if receipt else None,
        1,  # body_retained
        settled + DAY if state != "unknown" else None,  # expires_at: the default retention
        settled + 30 * DAY if state != "unknown" else None,  # forgotten_at: the tombstone
        "upstream" if receipt else None,  # resolution_by
        settled if receipt else None,  # resolution_at
        None,  # resolution_note
        evidence,
        "plain",  # storage
        seq,  # history_seq
        head,  # history_head
        1 if state != "unknown" else 0,  # request_kept: until expires_at
        _KIND,
    )
    status = 201 if receipt else 503 if state == "released" else 504
    log = ((operation_id, 1, settled, _request_id(index), status, _OUTCOMES[state], 0, None),)
    return FilledOperation(operation, events, log, (operation_id, 1, 0, 0))


_OUTCOMES = {"completed": "forwarded", "released": "released", "unknown": "unknown"}


def _copy(
    template: FilledOperation, index: int, created: float, rng: random.Random
) -> FilledOperation:
    """`template` as another operation: its own identity, times and digests."""
    operation_id = _ulid(created, rng)
    key = str(uuid.UUID(int=rng.getrandbits(128), version=4))
    shift = created - float(template.operation[11])  # type: ignore[arg-type]
    digest = _digest_like(rng)
    row = list(template.operation)
    row[0], row[2], row[7] = operation_id, key, digest(row[7])
    for column in (11, 12, 15, 20, 21, 23):
        if row[column] is not None:
            row[column] = float(row[column]) + shift  # type: ignore[arg-type]
    if row[18] is not None:
        row[18] = _receipt_body(index, key)
    shift_us = round(shift * 1e6)
    events = []
    prev = ""
    for event in template.events:  # prev links the chain as the template's did
        hash_ = digest(event[10])
        at_us = int(event[3]) + shift_us  # type: ignore[call-overload]
        events.append((operation_id, *event[1:3], at_us, *event[4:9], prev, hash_))
        prev = str(hash_)
    row[28] = prev
    log = tuple(
        (operation_id, line[1], float(line[2]) + shift, _request_id(index), *line[4:])  # type: ignore[arg-type]
        for line in template.log
    )
    return FilledOperation(tuple(row), tuple(events), log, (operation_id, *template.counts[1:]))


def _digest_like(rng: random.Random) -> Callable[[object], object]:
    """A function that keeps a digest's prefix (`hmac:`, `sha256:`, ...) and length and
    replaces its hex with random hex; empty strings stay empty."""

    def replaced(value: object) -> object:
        if not isinstance(value, str) or not value:
            return value
        prefix, _, hex_part = value.rpartition(":")
        fresh = f"{rng.getrandbits(4 * len(hex_part)):0{len(hex_part)}x}"
        return f"{prefix}:{fresh}" if prefix else fresh

    return replaced


def _ulid(created: float, rng: random.Random) -> str:
    """A ULID for `created` (48 bits of milliseconds, 80 random bits), as
    `gateway.engine.ids.new_operation_id` makes, without its monotonic state."""
    value = ((int(created * 1000) & ((1 << 48) - 1)) << 80) | rng.getrandbits(80)
    return "op_" + "".join(_ULID_ALPHABET[(value >> shift) & 31] for shift in range(125, -1, -5))


def _request_id(index: int) -> str:
    return f"req-{index:012x}{os.getpid() & 0xFFFF:04x}"


def _receipt_body(index: int, key: str) -> bytes:
    head = f'{{"id":"T-{index + 1}","title":"benchmark ticket","client_ref":"{key}","pad":"'
    return (head + "x" * max(0, _RECEIPT_BODY_SIZE - len(head) - 2) + '"}').encode()
