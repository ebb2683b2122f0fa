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

from gateway.engine.history import (
    Checkpoint,
    EventRow,
    KeyedFrom,
    NewEvent,
    chain,
    checkpoint_log_mac,
    checkpoint_mac,
    coalesced,
    keyed_from_mac,
    micros,
)
from gateway.engine.models import Operation
from gateway.store.crypto import BodyCipher, CipherError
from gateway.store.rows import PLAIN, SEALED

EVENT_COLUMNS = "operation_id, seq, type, at_us, actor, version, data, payload, storage, prev, hash"
"""The columns of `operation_events`, in the order `EventRow` plus `storage` is written."""

READ_COLUMNS = "operation_id, seq, type, at_us, actor, version, data, payload, prev, hash, storage"


class HistorySeal:
    """The history key a store chains with, and the operations whose chains it extended
    since its last checkpoint (`touched`, taken by `take_touched`)."""

    __slots__ = ("key", "touched")

    def __init__(self, key: bytes) -> None:
        self.key = key
        self.touched: set[str] = set()

    def take_touched(self) -> set[str]:
        touched, self.touched = self.touched, set()
        return touched


KEY_SINCE = "history_key_since"
"""The `gateway_meta` row that says when the history key was first used, signed by it.
Written in its second form (`v2:`) once every operation that had plain events then has
its keyed-since record (`baseline_rows`)."""


def key_since_record(key: bytes, since_us: int) -> bytes:
    return f"v2:{since_us}:{_sign(key, since_us)}".encode()


def baseline_done(key: bytes, record: bytes | None) -> bool:
    """Whether `record` says, signed by `key`, that the keyed-since records were written.
    Not so when absent (the key is new), in the first form (an upgrade), or not signed
    by this key (edited, or another key's): then they are written (or completed) now."""
    if record is None:
        return False
    version, _, rest = record.decode(errors="replace").partition(":")
    since, _, signature = rest.partition(":")
    if version != "v2" or not since.isdigit():
        return False
    return hmac.compare_digest(signature, _sign(key, int(since)))


def _sign(key: bytes, since_us: int) -> str:
    return hmac.new(key, f"{KEY_SINCE}:v2:{since_us}".encode(), hashlib.sha256).hexdigest()


BASELINE = (
    "SELECT o.id, COALESCE((SELECT MIN(e.seq) FROM operation_events e "
    "WHERE e.operation_id = o.id AND e.hash LIKE 'hmac:%'), o.history_seq + 1) "
    "FROM operations o WHERE o.history_seq > 0 AND NOT EXISTS "
    "(SELECT 1 FROM history_keyed_since k WHERE k.operation_id = o.id)"
)
"""For each operation without a keyed-since record: the first keyed event, or the one
after its head when none is keyed (every event it has predates the key)."""


def baseline_rows(key: bytes, found: Iterable[Sequence[Any]]) -> list[tuple[str, int, str]]:
    """Keyed-since records for `BASELINE`'s rows that have plain events (first keyed
    `seq` above 1): the others need none, every event of theirs must be keyed."""
    return [
        (op_id, int(seq), keyed_from_mac(key, op_id, int(seq)))
        for op_id, seq in found
        if int(seq) > 1
    ]


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
        state=operation.state.value,
    )
    if seal is not None and rows:
        seal.touched.add(operation.id)
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
    if seal is not None:
        seal.touched.add(operation.id)
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


class CheckpointEntry(NamedTuple):
    """One checkpoint: when, how many heads it wrote, the one before it (its `mac`)."""

    number: int
    at_us: int
    heads: int
    prev: str
    mac: str


def checkpoint_rows(
    key: bytes, number: int, at_us: int, heads: Iterable[Sequence[Any]]
) -> list[tuple[str, int, str, int, int, str]]:
    """`history_checkpoints` rows (operation_id, seq, head, checkpoint, at_us, mac) for
    the (id, history_seq, history_head) of the operations a checkpoint covers."""
    return [
        (op_id, int(seq), head, number, at_us, checkpoint_mac(key, op_id, int(seq), head, number))
        for op_id, seq, head in heads
    ]


def next_checkpoint(
    key: bytes, last: Sequence[Any] | None, at_us: int, count: int
) -> CheckpointEntry:
    """The log entry after `last` (checkpoint, mac), or the first."""
    number, prev = (1, "") if last is None else (int(last[0]) + 1, str(last[1]))
    mac = checkpoint_log_mac(key, number, at_us, count, prev)
    return CheckpointEntry(number, at_us, count, prev, mac)


def keyed_from_of(row: Sequence[Any] | None) -> KeyedFrom | None:
    return None if row is None else KeyedFrom(int(row[0]), str(row[1]))


def checkpoint_of(row: Sequence[Any] | None) -> Checkpoint | None:
    if row is None:
        return None
    seq, head, number, at_us, mac = row
    return Checkpoint(int(seq), str(head), int(number), int(at_us), str(mac))


UPSERT_CHECKPOINT = (
    "INSERT INTO history_checkpoints (operation_id, seq, head, checkpoint, at_us, mac) "
    "VALUES ({}) ON CONFLICT (operation_id) DO UPDATE SET seq = excluded.seq, "
    "head = excluded.head, checkpoint = excluded.checkpoint, at_us = excluded.at_us, "
    "mac = excluded.mac WHERE excluded.seq >= history_checkpoints.seq"
)
"""A head is checkpointed over an older one, never over a longer one: a row whose head
was set back stays caught by the checkpoint that saw more."""
