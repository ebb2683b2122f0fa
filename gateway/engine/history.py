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
    "Checkpoint",
    "EventRow",
    "KeyedFrom",
    "NewEvent",
    "RowFacts",
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

OPERATOR: Final = "an operator"
"""Who an admin is, as an owner reads it: never an operator's name."""

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
    state: str | None = None,
) -> tuple[list[EventRow], str, int]:
    """Place `events` after (`head`, `seq`): the rows to insert, the new head and seq.

    Every event written in one transaction shares its time and the version
    the operation has after it; each names the attempt it concerns and the
    state the operation is in after it (`state`), unless it already does, so
    that `verify_chain` can hold the row to its head event.
    """
    rows: list[EventRow] = []
    for event in events:
        seq += 1
        data = dict(event.data)
        data.setdefault("attempt", attempt)
        if state is not None:
            data.setdefault("state", state)
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


class RowFacts(NamedTuple):
    """What the operation's row says of where its history ends: its head event must agree."""

    version: int
    attempts: int
    state: str


class KeyedFrom(NamedTuple):
    """An operation's keyed-since record: the first `seq` that must carry a keyed hash
    (operations that had plain events when the history key came; others have none: every
    event must be keyed), signed with the key."""

    seq: int
    mac: str


class Checkpoint(NamedTuple):
    """The operation's head as the last checkpoint saw it (`CHECKPOINT_SECONDS`), signed
    with the key, outside the row: a tail cut after it is found even if the row was
    set back too."""

    seq: int
    head: str
    number: int
    at_us: int
    mac: str


ERASED_BY: Final = {"request": "request", "probe": "probes", "calibration": "probes"}
"""The name a `redacted` or `expired` event gives (`erased`) when it drops an erasable
field's value; a field not listed here (an operator's note, a redaction's reason) is
never erased, so its value missing is an edit."""

CHECKPOINT_SECONDS: Final = 60.0
"""How often the heads that changed are checkpointed (at most this long apart)."""


def keyed_from_mac(key: bytes, operation_id: str, seq: int) -> str:
    return _mac(key, f"keyed-from:{operation_id}:{seq}")


def checkpoint_mac(key: bytes, operation_id: str, seq: int, head: str, number: int) -> str:
    return _mac(key, f"checkpoint:{operation_id}:{seq}:{head}:{number}")


def checkpoint_log_mac(key: bytes, number: int, at_us: int, count: int, prev: str) -> str:
    return _mac(key, f"checkpoint-log:{number}:{at_us}:{count}:{prev}")


def _mac(key: bytes, text: str) -> str:
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def verify_chain(
    rows: Sequence[EventRow],
    *,
    head: str,
    head_seq: int,
    payloads: Sequence[bytes | None] = (),
    key: bytes | None = None,
    keyed_from: KeyedFrom | None = None,
    row: RowFacts | None = None,
    checkpoint: Checkpoint | None = None,
    operation_id: str = "",
) -> ChainReport:
    """Check every link, every hash and every commitment whose value is still kept, and
    the chain against what the operation's row (`head`, `head_seq`, `row`) says of it.

    `payloads` are the events' opened payloads (decrypted), when the caller opened
    them; otherwise the rows' own are used. A value that is gone is a redaction only
    if a later `redacted` or `expired` event names it (`ERASED_BY`). With a history
    `key`, every event from the operation's `keyed_from` record on (from the first,
    without one) must carry a keyed hash, whatever time it claims, and a
    `checkpoint` must still be in the chain.
    """
    start = 1
    if key is not None and keyed_from is not None:
        if not hmac.compare_digest(
            keyed_from.mac, keyed_from_mac(key, operation_id, keyed_from.seq)
        ):
            return _broken(
                0, 1, "its keyed-since record was edited (not signed by the history key)"
            )
        start = keyed_from.seq
    prev, redacted, erased_later = "", [], _erased_names(rows)
    for index, event in enumerate(rows):
        expected = index + 1
        if event.seq != expected:
            return _broken(index, expected, f"event {expected} is missing (found {event.seq})")
        if event.prev != prev:
            return _broken(index, event.seq, "it does not link to the event before it")
        try:
            data = json.loads(event.data)
        except ValueError:
            return _broken(index, event.seq, "its data is not JSON")
        keyed = event.hash.startswith(KEYED)
        if keyed and key is None:
            return _broken(index, event.seq, "it was hashed with a history key this gateway lacks")
        if not keyed and key is not None and event.seq >= start:
            return _broken(
                index,
                event.seq,
                f"its hash is not keyed, though every event from {start} on must be "
                "(rewritten without the history key)",
            )
        digest = event_hash(
            prev=event.prev, seq=event.seq, at_us=event.at_us, version=event.version,
            type=event.type, actor=event.actor, data=event.data, key=key if keyed else None,
        )  # fmt: skip
        if not hmac.compare_digest(digest, event.hash):
            return _broken(index, event.seq, "its content does not match its hash (edited)")
        payload = payloads[index] if index < len(payloads) else event.payload
        if payload is None and event.payload is not None:
            erased: bool | str | None = True  # kept, but not readable with these keys
        else:
            erased = _check_commitments(data, payload, erased_later.get(event.seq, set()))
        if erased is None:
            return _broken(index, event.seq, "an erasable field does not match its commitment")
        if isinstance(erased, str):
            return _broken(
                index,
                event.seq,
                f"its {erased} is gone, and no later redacted or expired event erased it",
            )
        if erased:
            redacted.append(event.seq)
        prev = event.hash
    if len(rows) != head_seq or prev != head:
        return ChainReport(
            len(rows),
            tuple(redacted),
            broken_seq=len(rows) + 1 if len(rows) < head_seq else len(rows),
            reason=f"the operation's head says {head_seq} events, and the chain ends elsewhere "
            "(events dropped, added or replaced)",
        )
    if row is not None and rows:
        mismatch = _row_mismatch(rows[-1], data, row)
        if mismatch is not None:
            return ChainReport(
                len(rows),
                tuple(redacted),
                broken_seq=len(rows),
                reason=f"event {len(rows)} is the head, but {mismatch} (events dropped "
                "and the row's head set back)",
            )
    if checkpoint is not None and key is not None:
        reason = _checkpoint_mismatch(rows, checkpoint, key, operation_id)
        if reason is not None:
            return ChainReport(len(rows), tuple(redacted), broken_seq=checkpoint.seq, reason=reason)
    return ChainReport(len(rows), tuple(redacted))


def verify_checkpoints(entries: Sequence[Any], key: bytes) -> dict[str, Any]:
    """The chain of checkpoint entries (number, at_us, heads, prev, mac), oldest first:
    numbered without a gap, each signed and naming the one before; what `verify` says
    of it (`latest_at` is worth keeping outside the store: the newest checkpoints,
    deleted together with what they saw, are the one cut a chain cannot show)."""
    prev = ""
    for index, (number, at_us, heads, before, mac) in enumerate(entries):
        reason = None
        if number != index + 1:
            reason = f"checkpoint {index + 1} is missing (found {number})"
        elif before != prev:
            reason = "it does not name the checkpoint before it"
        elif not hmac.compare_digest(mac, checkpoint_log_mac(key, number, at_us, heads, before)):
            reason = "it is not signed by the history key (edited)"
        if reason is not None:
            return {
                "ok": False,
                "count": len(entries),
                "latest_at": None,
                "broken": {"checkpoint": index + 1, "reason": f"checkpoint {index + 1}: {reason}"},
            }
        prev = mac
    latest = iso(entries[-1][1]) if entries else None
    return {"ok": True, "count": len(entries), "latest_at": latest, "broken": None}


def _row_mismatch(last: EventRow, data: Mapping[str, Any], row: RowFacts) -> str | None:
    """How the head event (`data`: its parsed data) disagrees with the row (version,
    attempt, state), or None."""
    if last.version != row.version:
        return f"it was written at version {last.version} and the row is at {row.version}"
    if data.get("attempt", row.attempts) != row.attempts:
        return f"it concerns attempt {data.get('attempt')} and the row has {row.attempts}"
    if data.get("state", row.state) != row.state:
        return f"it left the operation {data.get('state')} and the row says {row.state}"
    return None


def _checkpoint_mismatch(
    rows: Sequence[EventRow], checkpoint: Checkpoint, key: bytes, operation_id: str
) -> str | None:
    expected = checkpoint_mac(key, operation_id, checkpoint.seq, checkpoint.head, checkpoint.number)
    when = iso(checkpoint.at_us)
    if not hmac.compare_digest(checkpoint.mac, expected):
        return "its checkpoint was edited (not signed by the history key)"
    if len(rows) < checkpoint.seq:
        return (
            f"checkpoint {checkpoint.number} ({when}) saw event {checkpoint.seq}; the chain "
            f"ends at {len(rows)} (its tail was cut)"
        )
    if rows[checkpoint.seq - 1].hash != checkpoint.head:
        return (
            f"checkpoint {checkpoint.number} ({when}) saw another event {checkpoint.seq} "
            "(the chain was rewritten)"
        )
    return None


def _erased_names(rows: Sequence[EventRow]) -> dict[int, set[str]]:
    """For each `seq`, what the `redacted` and `expired` events after it erased."""
    after: dict[int, set[str]] = {}
    names: set[str] = set()
    for event in reversed(rows):
        after[event.seq] = set(names)
        if event.type in ("redacted", "expired"):
            try:
                erased = json.loads(event.data).get("erased", [])
            except ValueError:
                erased = []
            names |= {name for name in erased if isinstance(name, str)}
    return after


def _broken(index: int, seq: int, reason: str) -> ChainReport:
    return ChainReport(index, broken_seq=seq, reason=f"event {seq}: {reason}")


def _check_commitments(
    data: Mapping[str, Any], payload: bytes | None, erased_later: set[str]
) -> bool | str | None:
    """True when a committed field was erased (by a later event naming it), False when
    all are kept and match, None when one does not match its commitment, and the field's
    name when its value is gone with nothing that erased it."""
    names = [name[: -len(COMMITMENT)] for name in data if name.endswith(COMMITMENT)]
    if not names:
        return False
    kept = opened_payload(payload)
    erased = False
    for name in names:
        entry = kept.get(name)
        if not isinstance(entry, dict):
            if ERASED_BY.get(name) not in erased_later:
                return name
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
    """POSIX seconds as RFC 3339 UTC to the microsecond with a `Z`, as every operation JSON
    time is written: the form of the events' times (`iso`), so one instant (an operation's
    creation and its `claimed` event) reads the same wherever it is shown; `None` stays
    `None`."""
    return None if ts is None else iso(micros(ts))


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
        document["actor"] = OPERATOR
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
