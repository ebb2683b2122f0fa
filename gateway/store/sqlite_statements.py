"""Statements run on the SQLite writer thread: the claim, and the store's secret.

A claim reads before it writes and decides, in one transaction on the writer
thread, whether the key starts a new attempt, stays as it is, or turns
`unknown` because its lease ran out. The SQL fragments every verb shares (the
columns read back, the outcome fence) are here too, so the store module keeps
only what each verb does.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
from collections.abc import Callable, Sequence
from typing import Any

from gateway.engine.clock import Clock
from gateway.engine.history import NewEvent
from gateway.engine.ids import new_operation_id
from gateway.engine.lifecycle_events import (
    LEASE_EXPIRED,
    claimed_event,
    distinct_twin_event,
    lease_expired_event,
)
from gateway.engine.models import (
    ClaimRequest,
    ClaimResult,
    Evidence,
    Existing,
    NewAttempt,
    Operation,
    Similar,
    State,
)
from gateway.engine.twins import distinct_of, is_twin, noted_twin, refusing_twin
from gateway.store.crypto import BodyCipher
from gateway.store.history_rows import (
    BASELINE,
    EVENT_COLUMNS,
    KEY_SINCE,
    HistorySeal,
    baseline_done,
    baseline_rows,
    chained_rows,
    key_since_record,
)
from gateway.store.rows import (
    ATTACHABLE,
    LEGACY_SINCE,
    LEGACY_UNSETTLED,
    NO_LEGACY,
    OPERATION_TABLES,
    LegacyFingerprints,
    claim_changes,
    is_forgotten,
    scope_secret_lost,
)
from gateway.store.sqlite_schema import COLUMNS, SETTLED_FUNCTION

Decode = Callable[[Any], Operation]
Append = Callable[[sqlite3.Connection, Operation, Sequence[NewEvent]], Operation]
"""Appends events to the operation (as its change left it) in the caller's transaction."""

_SELECT = f"SELECT {', '.join(COLUMNS)} FROM operations"
_RETURNING = f"RETURNING {', '.join(COLUMNS)}"
_OUTCOME_RETURNING = f"{_RETURNING}, CASE WHEN watched THEN {SETTLED_FUNCTION}(id) END"
"""Outcome writes return the row and note a watched one for waking other workers.

The row's `watched` is read as this write updates it: SQLite serializes
writers, so a `watch` that committed first is seen, and one that commits after
is followed by the waiter's own re-read of the record."""

_EVIDENCE_UNLESS_REPEATED = (
    "CASE WHEN json_remove(json_extract(evidence, '$[#-1]'), '$.at') = "
    "json_remove(json(?1), '$.at') THEN evidence "
    "ELSE json_insert(evidence, '$[#]', json(?1)) END"
)
"""The operation's evidence with the item `?1` appended, unless it repeats the latest one
but for its time (`Evidence.repeats`; both sides are `Evidence.as_json` in one key order,
minified by `json()` alike)."""

_INSERT_EVENT = (
    f"INSERT INTO operation_events ({EVENT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)

ERASE_REQUEST = (
    "UPDATE operation_events SET payload = NULL "
    "WHERE operation_id = ? AND type IN ('claimed', 'probe', 'probe-blind') AND payload IS NOT NULL"
)
"""Drop an operation's recorded request and what its probes asked and read (retention,
redaction): their commitments stay."""

_OUTCOME_WRITABLE = "state IN ('in_flight', 'unknown')"
"""Where an outcome write (`complete`, `mark_unknown`, `release`) may land, under its
token: a holder whose lease lapsed (its record turned `unknown`, token unchanged)
still records what it learned; a resolution or a new attempt bumps the token."""

_RECEIPT_COLUMNS = (
    "state = 'completed', response_status = ?, response_headers = ?, response_body = ?, "
    "storage = ?, body_retained = ?, expires_at = ?, forgotten_at = ?"
)
"""What a receipt writes (`complete`, `complete_late`): its status, its sealed headers and
body, and when the receipt and the tombstone expire."""
_LATE_WRITABLE = f"(state = 'released' OR {ATTACHABLE})"
"""Where a stale attempt's answer is still recorded (`Store.complete_late`): a release it
proves wrong, or an operator's `applied` that has no receipt."""

_LATE_RESOLUTION = "CASE WHEN state = 'released' THEN {1} ELSE resolution_{0} END"
"""A late answer settles a released operation as the upstream's; an operator's `applied`
keeps its resolution and gains the receipt (format: the column's suffix, the new value)."""

_EVERY_SCOPE = (
    "WITH RECURSIVE scopes(scope) AS ("
    "SELECT min(scope) FROM operations "
    "UNION ALL SELECT (SELECT min(scope) FROM operations o WHERE o.scope > scopes.scope) "
    "FROM scopes WHERE scopes.scope IS NOT NULL) "
    "SELECT scope FROM scopes WHERE scope IS NOT NULL"
)

KEY_IN_ANY_SCOPE = f"key = ? AND scope IN ({_EVERY_SCOPE})"
"""A `WHERE` condition: the key (one parameter) in whichever scope holds it.

A key is unique per scope only, and its one index is `(scope, key)`: a
plain `key = ?` would read every row. So the distinct scopes are walked
through that index (one `min(scope) > previous` seek each), and the key is
looked up in each: a seek per scope, not a scan per operation."""

PREFIX_OF_KEY_OR_ID = (
    f"((scope IN ({_EVERY_SCOPE}) AND key >= ? AND key < ?) OR (id >= ? AND id < ?)) "
    "AND (substr(key, 1, ?) = ? OR substr(id, 1, ?) = ?)"
)
"""A `WHERE` condition: a key (in any scope) or an operation id that starts with a
text; its parameters are `prefix_parameters(text)`.

Both are ranges of an index, `(scope, key)` walked scope by scope as
`KEY_IN_ANY_SCOPE` does, and `id`'s: the cost is the rows that match, where
comparing the first characters of every row read the whole table (seconds at
ten million operations, on the event loop). The `substr` test (not LIKE, which
ignores case in SQLite) keeps the answer exact whatever the bound."""


def prefix_parameters(prefix: str) -> tuple[object, ...]:
    """The parameters of `PREFIX_OF_KEY_OR_ID` for `prefix`. The ranges end at the least
    text above every text that starts with `prefix` and is made of characters below
    U+10FFFF, as every key and id is.

    >>> low, high, *_ = prefix_parameters("abc")
    >>> low <= "abc" < "abcz" < high < "abd"
    True
    """
    high = prefix + "\U0010ffff"
    return (prefix, high, prefix, high, len(prefix), prefix, len(prefix), prefix)


def _claim(
    c: sqlite3.Connection,
    request: ClaimRequest,
    decode: Decode,
    clock: Clock,
    append: Append,
    cipher: BodyCipher | None,
    seal: HistorySeal | None = None,
    legacy: LegacyFingerprints = NO_LEGACY,
) -> ClaimResult:
    """Read first: a miss is a cheap index probe, while an INSERT that conflicts (every
    replay, if we inserted first) costs a built row and a constraint check (profiled).

    A claim that would start a new attempt first looks for the request's twin
    (`_twins`): SQLite runs one writer at a time, across worker processes too
    (`BEGIN IMMEDIATE`), so of racing new keys for one request the first one
    claims and every later one sees it.
    """
    now = clock.time()
    row = c.execute(
        f"{_SELECT} WHERE scope = ? AND key = ?", (request.scope, request.key)
    ).fetchone()
    if row is None:
        return _claim_new(c, request, now, decode, append, cipher, seal, legacy)
    current = decode(row)
    if not claim_changes(current, request):
        return Existing(current)
    if is_forgotten(current):
        for table in OPERATION_TABLES:
            c.execute(f"DELETE FROM {table} WHERE operation_id = ?", (current.id,))
        c.execute("DELETE FROM operations WHERE id = ?", (current.id,))
        return _claim_new(c, request, now, decode, append, cipher, seal, legacy)
    if current.state is State.RELEASED and request.same_request(current.fingerprint):
        refused, twin = _twins(c, request, now, decode, legacy)
        if refused is not None:
            return Similar(refused)
        updated = decode(
            c.execute(
                "UPDATE operations SET state = 'in_flight', attempts = attempts + 1, "
                "token = token + 1, version = version + 1, lease_owner = ?, "
                "lease_expires_at = ?, sent_at = ?, forgotten_at = NULL, updated_at = ? "
                f"WHERE id = ? {_RETURNING}",
                (request.owner, now + request.lease_seconds, now, now, current.id),
            ).fetchone()
        )
        distinct_from = _note_distinct(c, request, updated, twin, append)
        claimed = claimed_event(None, updated.token, distinct_from=distinct_from)
        return NewAttempt(append(c, updated, (claimed,)), twin=twin)
    # What is left: an in-flight record whose lease has run out turns unknown.
    evidence = Evidence(at=now, source="lease", detail=LEASE_EXPIRED)
    expired = decode(
        c.execute(
            "UPDATE operations SET state = 'unknown', lease_owner = NULL, "
            "updated_at = ?, version = version + 1, "
            "evidence = json_insert(evidence, '$[#]', json(?)) "
            f"WHERE id = ? {_RETURNING}",
            (now, json.dumps(evidence.as_json()), current.id),
        ).fetchone()
    )
    return Existing(append(c, expired, (lease_expired_event(LEASE_EXPIRED),)))


def _claim_new(
    c: sqlite3.Connection,
    request: ClaimRequest,
    now: float,
    decode: Decode,
    append: Append,
    cipher: BodyCipher | None,
    seal: HistorySeal | None,
    legacy: LegacyFingerprints,
) -> ClaimResult:
    refused, twin = _twins(c, request, now, decode, legacy)
    if refused is not None:
        return Similar(refused)
    operation = _insert_claim(c, request, now, cipher, seal, distinct_of(request, twin))
    _note_distinct(c, request, operation, twin, append)
    return NewAttempt(operation, twin=twin)


def _note_distinct(
    c: sqlite3.Connection,
    request: ClaimRequest,
    operation: Operation,
    twin: Operation | None,
    append: Append,
) -> str | None:
    """A claim marked distinct beside a twin: the twin's history names it (evidence, no
    ETag change); the twin's id, for the claim's own event."""
    twin_id = distinct_of(request, twin)
    if twin is not None and twin_id is not None:
        # Evidence about the twin, dated by the claim that learned it (the twin's own
        # `updated_at`, which dates its events otherwise, does not change).
        dated = twin._replace(updated_at=operation.updated_at)
        append(c, dated, (distinct_twin_event(operation.id),))
    return twin_id


_UNSETTLED_TWIN = (
    f"{_SELECT} WHERE scope = ? AND route = ? AND fingerprint {{}} "
    "AND state IN ('in_flight', 'unknown') AND sent_at > ? ORDER BY sent_at DESC LIMIT 1"
)
_COMPLETED_TWIN = (
    f"{_SELECT} WHERE scope = ? AND route = ? AND fingerprint {{}} AND state = 'completed' "
    "AND sent_at > ? AND (forgotten_at IS NULL OR forgotten_at > ?) "
    "ORDER BY sent_at DESC LIMIT 1"
)
_ONE_FORM, _TWO_FORMS = "= ?", "IN (?, ?)"
"""A twin's fingerprint: this request's, or (`LegacyFingerprints`) either of its forms."""
"""The latest twin of each kind: a seek each on `operations_by_request`, however many
completed twins the window holds."""


def _twins(
    c: sqlite3.Connection,
    request: ClaimRequest,
    now: float,
    decode: Decode,
    legacy: LegacyFingerprints,
) -> tuple[Operation | None, Operation | None]:
    """(the twin that refuses this claim, the twin a claim that goes ahead names).

    Finds, the decision is `gateway.engine.twins`'s. A fresh refusal binds the
    key to its twin for the window, so the same request under it keeps being
    refused after the twin settles.
    """
    guard = request.similar
    if guard is None or guard.derived:
        return None, None
    old_form = legacy.twin_form(request, now)
    forms = (request.fingerprint,) if old_form is None else (request.fingerprint, old_form)
    bound: Operation | None = None
    if not guard.distinct:
        binding = c.execute(
            "SELECT fingerprint, twin_id, refused_at FROM similar_refusals "
            "WHERE scope = ? AND key = ?",
            (request.scope, request.key),
        ).fetchone()
        if binding is not None and binding[0] in forms and guard.within(binding[2], now):
            row = c.execute(f"{_SELECT} WHERE id = ?", (binding[1],)).fetchone()
            bound = None if row is None else decode(row)
            if bound is not None and is_forgotten(bound):
                bound = None
    where = (request.scope, request.route, *forms, guard.since(now))
    match = _ONE_FORM if old_form is None else _TWO_FORMS
    row = c.execute(_UNSETTLED_TWIN.format(match), where).fetchone()
    if row is None:
        row = c.execute(_COMPLETED_TWIN.format(match), (*where, now)).fetchone()
    twin = None if row is None else decode(row)
    if twin is not None and not is_twin(twin, guard, now):
        twin = None
    refusing = refusing_twin(guard, bound=bound, twin=twin)
    if refusing is not None and bound is None:
        c.execute(
            "INSERT INTO similar_refusals (scope, key, fingerprint, twin_id, refused_at, "
            "expires_at) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (scope, key) DO UPDATE SET "
            "fingerprint = excluded.fingerprint, twin_id = excluded.twin_id, "
            "refused_at = excluded.refused_at, expires_at = excluded.expires_at",
            (request.scope, request.key, request.fingerprint, refusing.id, now, now + guard.window),
        )
    return refusing, noted_twin(guard, twin)


def _insert_claim(
    c: sqlite3.Connection,
    request: ClaimRequest,
    now: float,
    cipher: BodyCipher | None,
    seal: HistorySeal | None,
    distinct_from: str | None = None,
) -> Operation:
    """Insert the first attempt and return it as a read would, built from what was
    written (no `RETURNING`: every column is known here or a schema default), its
    `claimed` event chained before the row is written, so the row holds its head."""
    claimed = claimed_event(request.claimed, 1, distinct_from=distinct_from)
    operation = Operation(
        id=new_operation_id(now),
        scope=request.scope,
        key=request.key,
        state=State.IN_FLIGHT,
        route=request.route,
        method=request.method,
        path=request.path,
        fingerprint=request.fingerprint,
        attempts=1,
        token=1,
        version=1,
        created_at=now,
        updated_at=now,
        lease_owner=request.owner,
        lease_expires_at=now + request.lease_seconds,
        sent_at=now,
        observed_at=now,
    )
    events, operation = chained_rows(operation, (claimed,), cipher, seal)
    c.execute(
        "INSERT INTO operations (id, scope, key, state, route, method, path, fingerprint, "
        "attempts, token, version, created_at, updated_at, lease_owner, lease_expires_at, "
        "sent_at, request_kept, history_seq, history_head, request_kind) "
        "VALUES (?, ?, ?, 'in_flight', ?, ?, ?, ?, 1, 1, 1, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            operation.id,
            operation.scope,
            operation.key,
            operation.route,
            operation.method,
            operation.path,
            operation.fingerprint,
            now,
            now,
            operation.lease_owner,
            operation.lease_expires_at,
            now,
            int(claimed.payload is not None),
            operation.history_seq,
            operation.history_head,
            request.kind,
        ),
    )
    c.executemany(_INSERT_EVENT, events)
    return operation


def seal_histories(c: sqlite3.Connection, key: bytes, now_us: int) -> None:
    """With a history key: unless done with this key, give every operation that has
    plain events its keyed-since record (`BASELINE`), then sign that it was done."""
    row = c.execute("SELECT value FROM gateway_meta WHERE name = ?", (KEY_SINCE,)).fetchone()
    if baseline_done(key, None if row is None else bytes(row[0])):
        return
    c.executemany(
        "INSERT OR IGNORE INTO history_keyed_since (operation_id, seq, mac) VALUES (?, ?, ?)",
        baseline_rows(key, c.execute(BASELINE)),
    )
    c.execute(
        "INSERT INTO gateway_meta (name, value) VALUES (?, ?) "
        "ON CONFLICT (name) DO UPDATE SET value = excluded.value",
        (KEY_SINCE, key_since_record(key, now_us)),
    )


def load_legacy_fingerprints(c: sqlite3.Connection) -> LegacyFingerprints:
    """Whether twins are still looked up by the fingerprint form before version 2."""
    row = c.execute("SELECT value FROM gateway_meta WHERE name = ?", (LEGACY_SINCE,)).fetchone()
    if row is None:
        return LegacyFingerprints()
    unsettled = c.execute(LEGACY_UNSETTLED).fetchone() is not None
    value = row[0]  # a blob; text where someone wrote the row by hand
    since = float(value.decode() if isinstance(value, bytes) else value)
    return LegacyFingerprints(since, unsettled)


def load_or_create_secret(c: sqlite3.Connection) -> bytes:
    """The scope secret; made on first start only (see `scope_secret_lost`)."""
    row = c.execute("SELECT value FROM gateway_meta WHERE name = 'scope_secret'").fetchone()
    if row is not None:
        return bytes(row[0])
    if c.execute("SELECT 1 FROM operations LIMIT 1").fetchone() is not None:
        raise scope_secret_lost()
    secret = secrets.token_bytes(32)
    c.execute("INSERT INTO gateway_meta (name, value) VALUES ('scope_secret', ?)", (secret,))
    return secret
