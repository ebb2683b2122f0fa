"""Appending and reading history events: the part both stores share.

A store appends events in the transaction of the state change they record,
after the change's own statement: that statement returns the row as it now
stands (version, attempt, the store's clock, the chain's head), which the
events are chained from. Payloads (erasable fields) are sealed like receipts
when encryption keys are configured, with the marker that says so.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from gateway.engine.history import EventRow, NewEvent, chain, coalesced, micros
from gateway.engine.models import Operation
from gateway.store.crypto import BodyCipher, CipherError
from gateway.store.rows import PLAIN, SEALED

EVENT_COLUMNS = "operation_id, seq, type, at_us, actor, version, data, payload, storage, prev, hash"
"""The columns of `operation_events`, in the order `EventRow` plus `storage` is written."""

READ_COLUMNS = "operation_id, seq, type, at_us, actor, version, data, payload, prev, hash, storage"


class HistorySeal(NamedTuple):
    """The history key a store chains with, and since when (store clock, microseconds)
    every event must carry a keyed hash."""

    key: bytes
    since_us: int


KEY_SINCE = "history_key_since"
"""The `gateway_meta` row that says when the history key was first used, signed by it."""


def key_since_record(key: bytes, since_us: int) -> bytes:
    return f"{since_us}:{_sign(key, since_us)}".encode()


def key_since(key: bytes, record: bytes) -> int:
    """When the key was first used, from its signed record; 0 (every event must be keyed)
    when the record was not signed by this key: edited, or written with another key."""
    since, _, signature = record.decode(errors="replace").partition(":")
    try:
        moment = int(since)
    except ValueError:
        return 0
    return moment if hmac.compare_digest(signature, _sign(key, moment)) else 0


def _sign(key: bytes, since_us: int) -> str:
    return hmac.new(key, f"{KEY_SINCE}:{since_us}".encode(), hashlib.sha256).hexdigest()


def chained_rows(
    operation: Operation,
    events: Iterable[NewEvent],
    cipher: BodyCipher | None,
    seal: HistorySeal | None = None,
    *,
    at: float | None = None,
) -> tuple[list[tuple[Any, ...]], Operation]:
    """The rows to insert for `events` after `operation` (as the change left it), and
    the operation with its new head. The events' time is the change's (`updated_at`),
    or `at` for a change that leaves `updated_at` as it was (evidence)."""
    rows, head, seq = chain(
        operation.id,
        head=operation.history_head,
        seq=operation.history_seq,
        version=operation.version,
        at_us=micros(operation.updated_at if at is None else at),
        events=events,
        attempt=operation.attempts,
        key=None if seal is None else seal.key,
    )
    written = [as_written(row, cipher) for row in rows]
    return written, operation._replace(history_head=head, history_seq=seq)


def probe_merge(
    operation: Operation,
    events: Sequence[NewEvent],
    last: EventRow | None,
    seal: HistorySeal | None,
) -> EventRow | None:
    """The operation's last event rewritten to count `events` too (one probe verdict, the
    same as the last), or None when they are to be appended."""
    if last is None or len(events) != 1 or last.seq != operation.history_seq:
        return None
    return coalesced(
        last,
        events[0],
        at_us=micros(operation.observed_at),
        attempt=operation.attempts,
        key=None if seal is None else seal.key,
    )


def as_written(row: EventRow, cipher: BodyCipher | None) -> tuple[Any, ...]:
    payload, storage = row.payload, PLAIN
    if payload is not None and cipher is not None:
        payload, storage = cipher.seal(payload, _context(row.operation_id, row.seq)), SEALED
    return (
        row.operation_id, row.seq, row.type, row.at_us, row.actor, row.version, row.data,
        payload, storage, row.prev, row.hash,
    )  # fmt: skip


def _context(operation_id: str, seq: int) -> str:
    return f"{operation_id}/event/{seq}"


def read_rows(
    raw: Sequence[Sequence[Any]], cipher: BodyCipher | None
) -> tuple[list[EventRow], list[bytes | None]]:
    """Stored events (columns `READ_COLUMNS`) and their opened payloads.

    A payload that cannot be opened with the configured keys reads as erased
    for display (`None`); the rows keep the stored bytes for verification of
    the chain itself, which never needs the payload's plaintext... except for
    commitments, which are then reported as redacted, never as broken.
    """
    rows: list[EventRow] = []
    opened: list[bytes | None] = []
    for op_id, seq, type_, at_us, actor, version, data, payload, prev, digest, storage in raw:
        stored = None if payload is None else bytes(payload)
        rows.append(
            EventRow(op_id, int(seq), type_, int(at_us), actor, int(version), data, stored,
                     prev, digest)
        )  # fmt: skip
        opened.append(_open(stored, storage, op_id, int(seq), cipher))
    return rows, opened


def _open(
    payload: bytes | None, storage: str, operation_id: str, seq: int, cipher: BodyCipher | None
) -> bytes | None:
    if payload is None or storage != SEALED:
        return payload
    if cipher is None:
        return None
    try:
        return cipher.open(payload, _context(operation_id, seq))
    except CipherError:
        return None
