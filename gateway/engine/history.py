"""An operation's history: append-only events, hash-chained, that nothing rewrites.

The record of an operation says where it stands; its history says how it got
there and who decided what. An operator who releases an unknown operation
writes a note that must still be readable after the retry that followed
completed, and a row edited behind the gateway's back must be detectable. So
every state change appends events in its own transaction, and each event
stores the SHA-256 of its canonical form (RFC 8785 JSON of its metadata, its
time in integer microseconds on the store's clock, and the previous event's
hash); the operation row keeps the head (last hash and `seq`), so a dropped
tail is detected too.

Erasable fields (an operator's note, a redaction's reason, the recorded
request) are not in the chain: the chain holds a salted commitment to each
(`<name>_commitment`), and the value with its salt lives in the event's
payload. A redaction deletes the payload, and verification reports the event
as redacted, not broken; the salt keeps a commitment from confirming a guess
of what was erased.

Without a key, the chain detects accidental or naive edits only: whoever can
write the table can also recompute every hash. That is what it claims.

>>> rows, head, seq = chain(
...     "op_1", head="", seq=0, version=1, at_us=1_000_000,
...     events=(new_event("claimed", "gateway", {"token": 1}),), attempt=1)
>>> (rows[0].seq, rows[0].prev, seq, head == rows[0].hash)
(1, '', 1, True)
>>> verify_chain(rows, head=head, head_seq=seq).ok
True
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, NamedTuple

__all__ = [
    "ChainReport",
    "EventRow",
    "NewEvent",
    "chain",
    "event_json",
    "new_event",
    "verify_chain",
]

COMMITMENT = "_commitment"
"""Suffix of a chained field that commits to an erasable one kept in the payload."""

EVIDENCE_CAP: Final = 500
"""Events past which evidence-only events (probe verdicts that settle nothing) are no
longer recorded, after one chained `truncated` event: a probe that keeps answering
"not yet" for weeks cannot grow a history without bound. State changes always are."""

ADMIN_ONLY_FIELDS: Final = frozenset({"note", "reason"})
"""Erasable text an owner does not see in an admin's event unless it was shared."""
OPERATOR_ONLY_FIELDS: Final = frozenset({"calibration"})
"""Erasable fields an owner never sees, whoever wrote them: which other operation a
probe's calibration asked about."""


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event the engine decided, before a store gives it a place in the chain.

    `data` is the chained metadata (commitments included); `payload` is the
    erasable fields with their salts, JSON, stored outside the chain.
    """

    type: str
    actor: str
    data: Mapping[str, Any] = field(default_factory=dict)
    payload: bytes | None = None


def new_event(
    type: str,
    actor: str,
    data: Mapping[str, Any] | None = None,
    *,
    erasable: Mapping[str, Any] | None = None,
) -> NewEvent:
    """An event whose erasable fields are committed to by salted digests.

    Each value is serialized once: its canonical bytes are both what the
    commitment covers and what the payload keeps (a request body may be tens
    of KiB, on the path of every new key)."""
    chained = dict(data or {})
    kept: list[bytes] = []
    for name, value in (erasable or {}).items():
        if value is None:
            continue
        salt, text = _salt(), canonical(value)
        chained[name + COMMITMENT] = _commit(salt, text)
        kept.append(b'"%s":{"salt":"%s","value":%s}' % (name.encode(), salt.encode(), text))
    payload = b"{" + b",".join(kept) + b"}" if kept else None
    return NewEvent(type, actor, chained, payload)


_SALT_KEY = secrets.token_bytes(32)
_salts = itertools.count()


def _salt() -> str:
    """A salt nobody can predict without this process's random key: a keyed BLAKE2b of a
    counter (one `os.urandom` a call cost 16 us here, profiled, on every new key)."""
    counter = next(_salts).to_bytes(8, "big")
    return hashlib.blake2b(counter, key=_SALT_KEY, digest_size=16).hexdigest()


def capped(operation: Any, events: Sequence[NewEvent]) -> Sequence[NewEvent]:
    """The evidence-only `events` an operation with `history_seq` events still records."""
    seq = operation.history_seq
    if seq + len(events) < EVIDENCE_CAP:
        return events
    if seq < EVIDENCE_CAP:
        return (
            new_event(
                "truncated",
                "gateway",
                {"detail": f"{EVIDENCE_CAP} events reached; later probe verdicts are not kept"},
            ),
        )
    return ()


def coalesced(
    last: EventRow, event: NewEvent, *, at_us: int, attempt: int, key: bytes | None = None
) -> EventRow | None:
    """The chain's last event standing for `event` too, when both are the same probe
    verdict about the same attempt (a probe that keeps answering "not yet" for a week
    is one event with a count, not thousands); None when `event` must be appended.

    Only the head can be coalesced: nothing links to it yet but the operation's row,
    whose head the caller rewrites with the event in the same transaction."""
    if event.type != "probe" or last.type != "probe":
        return None
    try:
        data = json.loads(last.data)
    except ValueError:
        return None
    if data.get("attempt") != attempt or any(
        data.get(name) != event.data.get(name) for name in ("verdict", "status", "detail")
    ):
        return None
    data["count"] = int(data.get("count", 1)) + 1
    data["last_at_us"] = at_us
    text = canonical(data).decode()
    digest = event_hash(
        prev=last.prev, seq=last.seq, at_us=last.at_us, version=last.version, type=last.type,
        actor=last.actor, data=text, key=key,
    )  # fmt: skip
    return last._replace(data=text, hash=digest)


def _commit(salt: str, text: bytes) -> str:
    """The salted commitment to an erasable value's canonical bytes."""
    return hashlib.sha256(salt.encode() + text).hexdigest()


def canonical(value: Any) -> bytes:
    """RFC 8785 JSON of what events hold, made by the C encoder (5x faster than a
    general RFC 8785 library here, profiled). For event data the two agree: keys are
    ASCII (so code-point and UTF-16 orders agree), numbers are integers, and strings
    are valid Unicode (every text the gateway keeps went through a UTF-8 decode);
    `tests/test_history.py` checks the agreement on generated events."""
    return _CANONICAL.encode(value).encode()


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
"""Built once: `json.dumps` with any argument builds a new encoder on every call."""


class EventRow(NamedTuple):
    """One stored event, as both stores keep it (`operation_events`)."""

    operation_id: str
    seq: int
    type: str
    at_us: int
    actor: str
    version: int
    data: str
    """The chained metadata, as RFC 8785 JSON text."""
    payload: bytes | None
    """Erasable fields with their salts (JSON), sealed when encryption is on; `None`
    once erased (a redaction, a retention) or when the event had none."""
    prev: str
    hash: str


KEYED = "hmac:"
"""How a hash made with the history key begins (a plain one is bare hex)."""


def event_hash(
    *,
    prev: str,
    seq: int,
    at_us: int,
    version: int,
    type: str,
    actor: str,
    data: str,
    key: bytes | None = None,
) -> str:
    """The digest of an event's canonical form: what the chain links. SHA-256 (hex), or
    with a history `key` HMAC-SHA256 marked `hmac:`, which nobody without the key can
    recompute after an edit.

    The form is the RFC 8785 JSON of `{"actor", "at", "data", "prev", "seq", "type",
    "version"}` (`data` being the event's canonical data text, kept as stored):
    written out here in that key order rather than serialized again."""
    form = (
        f'{{"actor":{_quoted(actor)},"at":{at_us},"data":{data},"prev":{_quoted(prev)},'
        f'"seq":{seq},"type":{_quoted(type)},"version":{version}}}'
    ).encode()
    if key is not None:
        return KEYED + hmac.new(key, form, hashlib.sha256).hexdigest()
    return hashlib.sha256(form).hexdigest()


def _quoted(text: str) -> str:
    """A JSON string as RFC 8785 writes it; without the encoder when nothing needs escaping
    (types, hashes and most actors: this runs three times for every event)."""
    if text.isprintable() and '"' not in text and "\\" not in text:
        return f'"{text}"'
    return canonical(text).decode()


def chain(
    operation_id: str,
    *,
    head: str,
    seq: int,
    version: int,
    at_us: int,
    events: Iterable[NewEvent],
    attempt: int,
    key: bytes | None = None,
) -> tuple[list[EventRow], str, int]:
    """Place `events` after (`head`, `seq`): the rows to insert, the new head and seq.

    Every event written in one transaction shares its time and the version
    the operation has after it; each names the attempt it concerns unless it
    already does.
    """
    rows: list[EventRow] = []
    for event in events:
        seq += 1
        data = dict(event.data)
        data.setdefault("attempt", attempt)
        text = canonical(data).decode()
        digest = event_hash(
            prev=head, seq=seq, at_us=at_us, version=version, type=event.type,
            actor=event.actor, data=text, key=key,
        )  # fmt: skip
        rows.append(
            EventRow(operation_id, seq, event.type, at_us, event.actor, version, text,
                     event.payload, head, digest)
        )  # fmt: skip
        head = digest
    return rows, head, seq


def micros(seconds: float) -> int:
    """A store-clock time as the chain keeps it."""
    return round(seconds * 1_000_000)


@dataclass(frozen=True, slots=True)
class ChainReport:
    """What `verify_chain` found: intact, or the first event that is not."""

    events: int
    redacted: tuple[int, ...] = ()
    broken_seq: int | None = None
    reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.reason is None

    def as_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "events": self.events,
            "redacted": list(self.redacted),
            "broken": None if self.ok else {"seq": self.broken_seq, "reason": self.reason},
        }


def verify_chain(
    rows: Sequence[EventRow],
    *,
    head: str,
    head_seq: int,
    payloads: Sequence[bytes | None] = (),
    key: bytes | None = None,
    keyed_since_us: int | None = None,
) -> ChainReport:
    """Check every link, every hash and every commitment whose value is still kept.

    `payloads` are the events' opened payloads (decrypted), when the caller
    opened them; otherwise the rows' own are used. With a history `key`, every
    event written since `keyed_since_us` (when the key was first used) must
    carry a keyed hash: a plain one there was rewritten by someone without it.
    """
    prev, redacted = "", []
    for index, row in enumerate(rows):
        expected = index + 1
        if row.seq != expected:
            return _broken(index, expected, f"event {expected} is missing (found {row.seq})")
        if row.prev != prev:
            return _broken(index, row.seq, "it does not link to the event before it")
        try:
            data = json.loads(row.data)
        except ValueError:
            return _broken(index, row.seq, "its data is not JSON")
        keyed = row.hash.startswith(KEYED)
        if keyed and key is None:
            return _broken(index, row.seq, "it was hashed with a history key this gateway lacks")
        if not keyed and key is not None and row.at_us >= (keyed_since_us or 0):
            return _broken(
                index, row.seq, "its hash is not keyed, though the history key was set before it"
            )
        digest = event_hash(
            prev=row.prev, seq=row.seq, at_us=row.at_us, version=row.version, type=row.type,
            actor=row.actor, data=row.data, key=key if keyed else None,
        )  # fmt: skip
        if not hmac.compare_digest(digest, row.hash):
            return _broken(index, row.seq, "its content does not match its hash (edited)")
        payload = payloads[index] if index < len(payloads) else row.payload
        erased = _check_commitments(data, payload)
        if erased is None:
            return _broken(index, row.seq, "an erasable field does not match its commitment")
        if erased:
            redacted.append(row.seq)
        prev = row.hash
    if len(rows) != head_seq or prev != head:
        return ChainReport(
            len(rows),
            tuple(redacted),
            broken_seq=len(rows) + 1 if len(rows) < head_seq else len(rows),
            reason=f"the operation's head says {head_seq} events, and the chain ends elsewhere "
            "(events dropped, added or replaced)",
        )
    return ChainReport(len(rows), tuple(redacted))


def _broken(index: int, seq: int, reason: str) -> ChainReport:
    return ChainReport(index, broken_seq=seq, reason=f"event {seq}: {reason}")


def _check_commitments(data: Mapping[str, Any], payload: bytes | None) -> bool | None:
    """True when a committed field was erased, False when all are kept and match,
    None when one does not match its commitment."""
    names = [name[: -len(COMMITMENT)] for name in data if name.endswith(COMMITMENT)]
    if not names:
        return False
    kept = opened_payload(payload)
    erased = False
    for name in names:
        entry = kept.get(name)
        if not isinstance(entry, dict):
            erased = True
            continue
        if (
            _commit(str(entry.get("salt")), canonical(entry.get("value")))
            != data[name + COMMITMENT]
        ):
            return None
    return erased


def opened_payload(payload: bytes | None) -> dict[str, Any]:
    if not payload:
        return {}
    try:
        document = json.loads(payload)
    except ValueError:
        return {}
    return document if isinstance(document, dict) else {}


def iso_seconds(ts: float | None) -> str | None:
    """POSIX seconds as RFC 3339 UTC with a `Z` (milliseconds), as every operation JSON
    time is written; `None` stays `None`."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def iso(at_us: int) -> str:
    return datetime.fromtimestamp(at_us / 1_000_000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def event_json(row: EventRow, payload: bytes | None, *, for_owner: bool) -> dict[str, Any]:
    """An event as the operation JSON shows it: metadata, plus the erasable values still
    kept. An owner sees that an admin acted and when, not who, nor the note unless the
    admin shared it."""
    try:
        data: dict[str, Any] = json.loads(row.data)
    except ValueError:
        data = {}
    kept = opened_payload(payload)
    document: dict[str, Any] = {
        "seq": row.seq,
        "type": row.type,
        "at": iso(row.at_us),
        "actor": row.actor,
        "version": row.version,
    }
    hide_text = False
    if for_owner and row.actor.startswith("admin"):
        document["actor"] = "admin"
        hide_text = not data.get("share_with_owner", False)
    for name, value in data.items():
        if name == "last_at_us" and isinstance(value, int):
            document["last_at"] = iso(value)
            continue
        if not name.endswith(COMMITMENT):
            document[name] = value
            continue
        erasable = name[: -len(COMMITMENT)]
        if erasable == "request":
            continue  # shown as the operation's `request`, to operators only
        entry = kept.get(erasable)
        if hide_text and erasable in ADMIN_ONLY_FIELDS:
            continue
        if for_owner and erasable in OPERATOR_ONLY_FIELDS:
            continue
        if isinstance(entry, dict):
            document[erasable] = entry.get("value")
        else:
            document[erasable + "_redacted"] = True
    return document


def request_of(payload: bytes | None) -> Any:
    """The recorded request kept in a `claimed` event's payload, or None once erased."""
    entry = opened_payload(payload).get("request")
    return entry.get("value") if isinstance(entry, dict) else None
