"""The history an operation recorded before histories existed, rebuilt from its record.

Databases from before the history hold operations whose story is only their
row: how many attempts, the outcome, who resolved it and the note. The
migration gives each such operation the events its row still proves, every
one marked `reconstructed`, so that every operation has a chain to verify
and nobody mistakes a rebuilt event for one recorded as it happened.
"""

from __future__ import annotations

from gateway.engine.history import EventRow, NewEvent, chain, micros, new_event
from gateway.engine.models import Operation, State

_MARK = {"reconstructed": True}


def reconstructed_rows(operation: Operation) -> tuple[list[EventRow], str, int]:
    """The events `operation`'s row proves, chained; the head and count to store."""
    head, seq, rows = "", 0, []
    for at, event in _events(operation):
        chained, head, seq = chain(
            operation.id,
            head=head,
            seq=seq,
            version=operation.version,
            at_us=micros(at),
            events=(event,),
            attempt=operation.attempts,
        )
        rows.extend(chained)
    return rows, head, seq


def _events(operation: Operation) -> list[tuple[float, NewEvent]]:
    events = [
        (
            operation.created_at,
            new_event(
                "claimed", "gateway", {**_MARK, "attempt": 1, "attempts": operation.attempts}
            ),
        )
    ]
    settled_at = operation.updated_at
    resolution = operation.resolution
    if operation.state is State.UNKNOWN:
        last = operation.evidence[-1] if operation.evidence else None
        kind = "lease-expired" if last is not None and last.source == "lease" else "connection-lost"
        detail = last.detail if last is not None else "the outcome is not known"
        events.append((settled_at, new_event(kind, "gateway", {**_MARK, "detail": detail})))
    if resolution is not None and resolution.by == "upstream":
        status = operation.response.status if operation.response is not None else None
        events.append(
            (resolution.at, new_event("answered", "gateway", {**_MARK, "status": status}))
        )
    elif resolution is not None:
        outcome = "applied" if operation.state is State.COMPLETED else "not_applied"
        events.append(
            (
                resolution.at,
                new_event(
                    "resolved",
                    resolution.by,
                    {**_MARK, "outcome": outcome, "by": resolution.by},
                    erasable={"note": resolution.note},
                ),
            )
        )
    if operation.state is State.RELEASED:
        last = operation.evidence[-1] if operation.evidence else None
        detail = last.detail if last is not None else "the key may be sent again"
        events.append((settled_at, new_event("released", "gateway", {**_MARK, "detail": detail})))
    return events
