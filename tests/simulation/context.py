"""What the simulation knows about the engine call a store write or an upstream call is part of.

Every engine call the simulator starts runs in its own asyncio task with its
own `CallContext` (a context variable is per task). The fault wrapper notes
the store faults that hit the call, the scripted upstream notes the probe
answer it delivered, and the memory database copies the context into each
write's history entry. That is how an invariant can say "this release was
written by replica r2 acting on the probe answered at t=+14.2" without
guessing from timing.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.simulation.upstream import ProbeCall, SendCall

__all__ = ["CALL", "CallContext", "OperatorVerdict", "annotate"]


@dataclass(frozen=True, slots=True)
class OperatorVerdict:
    """What the simulated operator saw at the upstream when it decided."""

    operation_id: str
    applied: bool
    effects: int
    at: float


@dataclass(slots=True)
class CallContext:
    """One engine call (a request, a lookup, a reconcile, an upkeep, an operator's resolve)."""

    label: str
    replica: str
    ambiguous_commits: list[str] = field(default_factory=list)
    """Store writes of this call that applied and then reported failure."""
    store_errors: list[str] = field(default_factory=list)
    """Every store call of this call that raised `StoreUnavailable`."""
    probe: ProbeCall | None = None
    """The last probe answer delivered to this call."""
    probes: dict[str, ProbeCall] = field(default_factory=dict)
    """The last probe answer delivered to this call about each operation id: one call
    may ask about several (a calibration asks about a sample and an unused key before
    the verdict it calibrates for is written)."""
    send: SendCall | None = None
    """The last upstream answer (to a request) delivered to this call."""
    claimed: str | None = None
    """The operation id of the last attempt this call was granted."""
    refused_by: str | None = None
    """The twin the store named when it last refused this call's claim (`Similar`)."""
    operator: OperatorVerdict | None = None
    intent: str | None = None
    """For a request: the agent's intended call it is (the same across a lost key)."""
    distinct: bool = False
    """For a request: the agent marked it distinct (`Idempotency-Distinct: ?1`)."""


CALL: ContextVar[CallContext | None] = ContextVar("simulation_call", default=None)


def annotate() -> dict[str, Any]:
    """The notes the memory database attaches to a write (`MemoryDatabase.annotate`)."""
    call = CALL.get()
    if call is None:
        return {"replica": None, "label": "sim"}
    return {
        "replica": call.replica,
        "label": call.label,
        "probe": call.probe,
        "probes": dict(call.probes),  # a copy: the call may ask again after this write
        "operator": call.operator,
        "intent": call.intent,
        "distinct": call.distinct,
    }
