"""The history's vocabulary: one constructor per kind of event the gateway records.

Which event a transition records is decided here, once, for the engine and
the stores (a store records the events of the transitions it decides itself:
a lease found expired during a claim, a body dropped at retention). Each
event's metadata is chained; notes, reasons and the recorded request are
erasable and kept outside the chain (`gateway.engine.history`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from gateway.engine.history import NewEvent, new_event

if TYPE_CHECKING:
    from gateway.engine.calibrator import Admission

LEASE_EXPIRED = "the lease expired before an outcome was recorded"
LEASE_LAPSED = (
    "the holder found its own lease lapsed (the gateway was paused or stalled past the "
    "lease); it carries on as the stale holder: its answer is still recorded if no other "
    "attempt began"
)

UnknownKind = Literal["timed-out", "connection-lost", "lease-expired"]


def claimed_event(
    recorded: NewEvent | None, token: int, *, distinct_from: str | None = None
) -> NewEvent:
    """A key bound (attempt 1, with the request kept when `recorded`) or a released key's
    new attempt; `distinct_from` names the twin of a request marked distinct."""
    data: dict[str, Any] = {"token": token}
    if distinct_from is not None:
        data["distinct_from"] = distinct_from
    if recorded is None:
        return NewEvent("claimed", "gateway", data)
    return NewEvent(recorded.type, recorded.actor, {**recorded.data, **data}, recorded.payload)


DISTINCT_TWIN = "distinct-twin"
"""Evidence on a twin: a request marked distinct was claimed beside it (no ETag change)."""


def distinct_twin_event(operation_id: str) -> NewEvent:
    return new_event(DISTINCT_TWIN, "gateway", {"operation": operation_id})


def request_claimed(request: dict[str, Any] | None) -> NewEvent:
    """The first attempt's `claimed` event, keeping the request as an erasable field."""
    return new_event("claimed", "gateway", erasable={"request": request})


def sent_event(
    token: int, forwarded_key: str | None, *, attempt: int, body_digest: str | None = None
) -> NewEvent:
    """An attempt's send; `body_digest` (keyed, `gateway.engine.digests`) says which bytes
    it forwarded: attempts of one request may send different bytes of equal JSON."""
    data: dict[str, Any] = {"attempt": attempt, "token": token, "forwarded_key": forwarded_key}
    if body_digest is not None:
        data["body_digest"] = body_digest
    return new_event("sent", "gateway", data)


def answered_event(status: int, *, attempt: int, jsonrpc: str | None = None) -> NewEvent:
    data: dict[str, Any] = {"attempt": attempt, "status": status}
    if jsonrpc is not None:
        data["jsonrpc"] = jsonrpc
    return new_event("answered", "gateway", data)


def unknown_event(kind: UnknownKind, detail: str) -> NewEvent:
    return new_event(kind, "gateway", {"detail": detail})


def lease_expired_event(detail: str) -> NewEvent:
    return unknown_event("lease-expired", detail)


def released_event(detail: str, *, status: int | None = None) -> NewEvent:
    data: dict[str, Any] = {"detail": detail}
    if status is not None:
        data["status"] = status
    return new_event("released", "gateway", data)


def resolved_event(
    *,
    outcome: str,
    by: str,
    actor: str,
    note: str | None,
    force: bool = False,
    share_with_owner: bool = False,
) -> NewEvent:
    return new_event(
        "resolved",
        actor,
        {"outcome": outcome, "by": by, "force": force, "share_with_owner": share_with_owner},
        erasable={"note": note},
    )


def receipt_attached_event(
    *, actor: str, status: int, note: str, share_with_owner: bool = False
) -> NewEvent:
    """The receipt an operator's `applied` went without, attached later (once)."""
    return new_event(
        "receipt-attached",
        actor,
        {"status": status, "share_with_owner": share_with_owner},
        erasable={"note": note},
    )


CANCELLATION_HELD = (
    "the client cancelled this call (notifications/cancelled); the gateway held the "
    "cancellation back, so the call runs to its end and its answer is the receipt: a "
    "cancelled call may still have taken effect"
)


def cancellation_held_event(*, attempt: int) -> NewEvent:
    """A client's cancellation of a protected call, not forwarded (`gateway.mcp`)."""
    return new_event(
        "cancellation-held", "gateway", {"attempt": attempt, "detail": CANCELLATION_HELD}
    )


def probe_event(
    verdict: str, *, status: int | None, detail: str, seen: dict[str, Any] | None = None
) -> NewEvent:
    """A probe's verdict; `seen` (the request it made, secrets redacted, and what it
    read) is erasable and sealed like a recorded request."""
    data = {"verdict": verdict, "status": status, "detail": detail}
    return new_event("probe", "probe", data, erasable={"probe": seen})


def probe_blind_event(admission: Admission) -> NewEvent:
    """The probe would have released this operation, but it cannot see its kind; which
    completed operation it failed to find is the operators' (`calibration`, admin-only)."""
    data = {"kind": admission.kind, "applies_to": admission.entry, "detail": admission.detail}
    calibration = None if admission.sample is None else {"sample": admission.sample}
    return new_event("probe-blind", "probe", data, erasable={"calibration": calibration})


def redacted_event(*, actor: str, reason: str, erased: list[str]) -> NewEvent:
    return new_event("redacted", actor, {"erased": erased}, erasable={"reason": reason})


def expired_event(erased: list[str]) -> NewEvent:
    return new_event("expired", "gateway", {"erased": erased})
