"""Turning stored rows into operations and back: shared by the SQLite and PostgreSQL stores.

Both stores select the same columns in the same order (times as POSIX
seconds, headers as a JSON list of pairs, evidence as a JSON list), so one
mapper serves both and they cannot drift apart.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from gateway.engine.errors import StoreUnavailable
from gateway.engine.models import (
    ClaimRequest,
    Evidence,
    Operation,
    Resolution,
    State,
    StoredResponse,
)
from gateway.store.crypto import BodyCipher, CipherError

COLUMN_NAMES = (
    "id",
    "scope",
    "key",
    "state",
    "route",
    "method",
    "path",
    "fingerprint",
    "attempts",
    "token",
    "version",
    "created_at",
    "updated_at",
    "lease_owner",
    "lease_expires_at",
    "sent_at",
    "response_status",
    "response_headers",
    "response_body",
    "body_retained",
    "expires_at",
    "forgotten_at",
    "resolution_by",
    "resolution_at",
    "resolution_note",
    "evidence",
    "storage",
    "history_seq",
    "history_head",
    "observed_at",
)
"""The columns both stores select, in the order `row_to_operation` reads them.

`observed_at` is not a column of the table but the store's clock at the
moment of the read or write (see `Operation.observed_at`): each store puts
its own clock expression there.
"""

_FIELD_COUNT = len(COLUMN_NAMES)
_STATES = {state.value: state for state in State}
"""A dict lookup: `State(value)` goes through the enum machinery, once per decoded row."""


PLAIN = "plain"
SEALED = "sealed"
"""How a row keeps its receipt (`storage`): as it came, or sealed with `[store]
encryption_keys` (body and headers). Said explicitly, never sniffed from bytes."""


class SealedReceipt(NamedTuple):
    """A receipt's columns as a store writes them."""

    headers: str | None
    body: bytes | None
    storage: str


def seal_receipt(
    response: StoredResponse | None,
    body: bytes | None,
    operation_id: str,
    cipher: BodyCipher | None,
) -> SealedReceipt:
    """The headers and body columns of a receipt (`body` is `None` when not kept), sealed
    when encryption keys are configured, with the marker that says so."""
    headers = None if response is None else encode_headers(response.headers)
    if cipher is None:
        return SealedReceipt(headers, body, PLAIN)
    sealed_headers = (
        None
        if headers is None
        else base64.b64encode(cipher.seal(headers.encode(), operation_id + "/headers")).decode()
    )
    sealed_body = None if body is None else cipher.seal(body, operation_id)
    return SealedReceipt(sealed_headers, sealed_body, SEALED)


def open_receipt(
    headers: str | None,
    body: bytes | None,
    storage: str,
    operation_id: str,
    cipher: BodyCipher | None,
) -> tuple[tuple[tuple[str, str], ...], bytes]:
    if storage != SEALED:
        return decode_headers(headers), b"" if body is None else bytes(body)
    if cipher is None:
        raise CipherError(
            f"the receipt of {operation_id} is sealed but [store] encryption_keys is empty"
        )
    opened = (
        None
        if headers is None
        else cipher.open(base64.b64decode(headers), operation_id + "/headers").decode()
    )
    return decode_headers(opened), b"" if body is None else cipher.open(bytes(body), operation_id)


def as_stored(response: StoredResponse, *, body_retained: bool) -> StoredResponse:
    """The receipt as a read of it returns it: without its body when the body was not kept."""
    return response if body_retained else dataclasses.replace(response, body=b"")


def is_forgotten(operation: Operation) -> bool:
    """Past its tombstone, on the store's clock: the key starts over."""
    return (
        operation.state in (State.COMPLETED, State.RELEASED)
        and operation.forgotten_at is not None
        and operation.forgotten_at <= operation.observed_at
    )


WITNESS_PREFIX = "clock_witness:"
"""`gateway_meta` names of the clock witnesses, one per host boot (`Store.write_clock_witness`)."""


def scope_secret_lost() -> StoreUnavailable:
    """Why a store that holds operations but no scope secret refuses to start.

    A new secret would put every caller in a new scope: keys already used (in
    flight, unknown, completed) would be met as new keys and sent again, the one
    thing the gateway exists to prevent. Both stores refuse the same way.
    """
    return StoreUnavailable(
        "the store holds operations but no scope secret (gateway_meta 'scope_secret'): "
        "a new secret would move every caller to a new scope, and keys already used "
        "would be sent again as new operations; restore the secret from a backup of "
        "this store, or start on an empty store"
    )


OPERATION_TABLES = (
    "operation_events",
    "history_checkpoints",
    "history_keyed_since",
    "request_log",
    "request_counts",
)
"""The tables whose rows belong to one operation (`operation_id`): deleted with it."""

ATTACHABLE = (
    "(state = 'completed' AND response_status IS NULL AND resolution_by IN ('owner', 'admin'))"
)
"""Where a receipt may still be attached (`Store.attach_receipt`, a late answer): an
operation completed by an owner's or an operator's `applied` without one. SQL both stores
run as it is."""

LEGACY_MARGIN = 3600.0
"""Seconds past a guard's window after the upgrade during which twins are still looked up
by the old fingerprint form: room for the gateway host's clock to disagree with the store's."""


class LegacyFingerprints(NamedTuple):
    """Whether a claim's twin check looks up the old fingerprint form too (see
    `gateway.engine.fingerprint`): while an operation of that form may still refuse a new
    key, that is while one is unsettled, or inside the guard's window after the upgrade.
    Read once when the store opens; `since` is None where no such operation existed."""

    since: float | None = None
    unsettled: bool = False

    def twin_form(self, request: ClaimRequest, now: float) -> str | None:
        """The old form to look twins and bindings up by too, or None."""
        guard = request.similar
        if self.since is None or guard is None or request.legacy_fingerprint is None:
            return None
        if self.unsettled or now < self.since + guard.window + LEGACY_MARGIN:
            return request.legacy_fingerprint
        return None


NO_LEGACY = LegacyFingerprints()
"""A store with no operation of the old fingerprint form."""

LEGACY_SINCE = "fingerprint_v2_since"
"""The `gateway_meta` row that dates the upgrade to version 2 fingerprints (POSIX seconds
as text), written by the migration only where operations of the old form existed."""
LEGACY_UNSETTLED = (
    "SELECT 1 FROM operations WHERE state IN ('in_flight', 'unknown') "
    "AND method <> 'tools/call' AND (fingerprint LIKE 'v1:%' OR fingerprint LIKE 'sha256:%') "
    "LIMIT 1"
)
"""Whether an operation of the old fingerprint form is still unsettled (by the state index)."""


def claim_changes(current: Operation, request: ClaimRequest) -> bool:
    """Whether a claim of `current`'s key changes its record, rather than report it.

    It does for a forgotten record (the key starts over), a released one with
    the same fingerprint (a new attempt) and an in-flight one whose lease has
    run out (it turns unknown). Any other record is reported as it stands, so
    a store may answer such a claim from a plain read, without a lock.
    """
    if is_forgotten(current):
        return True
    if current.state is State.RELEASED:
        return request.same_request(current.fingerprint)
    return current.lease_expired()


_COMPACT_JSON = json.JSONEncoder(separators=(",", ":"))
"""Built once: `json.dumps` with any argument builds a new encoder on every call."""


def encode_headers(headers: Sequence[tuple[str, str]]) -> str:
    """Pairs as a JSON list of two-element lists (tuples encode as lists)."""
    return _COMPACT_JSON.encode(headers if isinstance(headers, tuple) else tuple(headers))


def decode_headers(raw: str | None) -> tuple[tuple[str, str], ...]:
    if not raw:
        return ()
    return tuple(map(tuple, json.loads(raw)))


def encode_cursor(seq: int) -> str:
    return base64.urlsafe_b64encode(f"s{seq}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str | None) -> int:
    if not cursor:
        return 0
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        text = base64.urlsafe_b64decode(padded.encode()).decode()
        if not text.startswith("s"):
            raise ValueError(cursor)
        seq = int(text[1:])
        if not 0 <= seq < 2**63:
            raise ValueError(cursor)
        return seq
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"invalid cursor {cursor!r}") from exc


def row_to_operation(
    row: Iterable[Any] | None,
    cipher: BodyCipher | None = None,
    *,
    stored: StoredResponse | None = None,
    lenient: bool = False,
) -> Operation:
    """The operation in a row whose first columns are the stores' shared column list.

    Extra trailing columns (a store's own bookkeeping) are ignored. `stored` is
    the receipt the statement itself just wrote: taken as it is rather than
    decoded (and decrypted) back from the row, on the hot path of every
    completed request.
    """
    if row is None:
        raise ValueError("no row: the statement matched nothing it was sure to match")
    (
        op_id,
        scope,
        key,
        state,
        route,
        method,
        path,
        fingerprint,
        attempts,
        token,
        version,
        created_at,
        updated_at,
        lease_owner,
        lease_expires_at,
        sent_at,
        response_status,
        response_headers,
        response_body,
        body_retained,
        expires_at,
        forgotten_at,
        resolution_by,
        resolution_at,
        resolution_note,
        evidence,
        storage,
        history_seq,
        history_head,
        observed_at,
    ) = tuple(row)[:_FIELD_COUNT]
    response = stored
    # A kept receipt whose body column is empty (NULL) had its body swept at
    # expiry: it reads as no response, never as an empty one to replay.
    swept = response_body is None and body_retained
    if response is None and response_status is not None and not swept:
        try:
            headers, body = open_receipt(response_headers, response_body, storage, op_id, cipher)
        except CipherError as exc:
            if not lenient:
                raise StoreUnavailable(
                    "a stored receipt cannot be opened with the configured keys",
                    internal=str(exc),
                ) from exc
            # A listing shows the row without its receipt: one row never breaks a page.
        else:
            response = StoredResponse(status=response_status, headers=headers, body=body)
    return Operation(
        id=op_id,
        scope=scope,
        key=key,
        state=_STATES[state],
        route=route,
        method=method,
        path=path,
        fingerprint=fingerprint,
        attempts=attempts,
        token=token,
        version=version,
        created_at=created_at,
        updated_at=updated_at,
        lease_owner=lease_owner,
        lease_expires_at=lease_expires_at,
        sent_at=sent_at,
        response=response,
        body_retained=bool(body_retained),
        expires_at=expires_at,
        forgotten_at=forgotten_at,
        resolution=(
            Resolution(by=resolution_by, at=resolution_at, note=resolution_note)
            if resolution_by
            else None
        ),
        evidence=(
            tuple(Evidence(**item) for item in json.loads(evidence))
            if evidence and evidence != "[]"
            else ()
        ),
        observed_at=observed_at,
        history_seq=history_seq,
        history_head=history_head,
    )


SCOPES_NORMALISED_SINCE = "scopes_normalised_since"
"""The change `Store.upgraded_since` dates when credentials began to be normalised for
scopes (`gateway.engine.scopes`)."""

DERIVED_KEYS_KEYED_SINCE = "derived_keys_keyed_since"
"""The change `Store.upgraded_since` dates when derived MCP keys began to be keyed
(`gateway.engine.digests`)."""

UPGRADES = (SCOPES_NORMALISED_SINCE, DERIVED_KEYS_KEYED_SINCE)
"""Each is a `gateway_meta` row: the store clock's time as text, or "0" for a store that
had no operations when its gateway first made the change."""


def upgraded_since(value: bytes | str) -> float | None:
    text = value.decode() if isinstance(value, bytes) else value
    since = float(text)
    return since if since > 0 else None
