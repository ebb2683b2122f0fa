"""`/admin/probes/{route}`: what a route's probe can see, its calibration, and trusting it.

A probe's "not found" releases a key only for request kinds it is declared
for (`applies_to`) and calibrated to see (`gateway.engine.calibrator`). These
endpoints show the calibration rows, run the calibration of every kind now
(`check`, what `idempotency-gateway probes check ROUTE` prints), and let an
admin re-enable a blind probe for one kind (`trust`, with a note): the
calibration runs again, and if it still fails the trust is an override that
ends after 24 hours. Each answer's JSON comes from one pydantic model, which
also writes its OpenAPI schema.
"""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gateway.config import RouteSettings
from gateway.engine.calibration import Calibration
from gateway.engine.calibrator import CalibrationRun
from gateway.engine.errors import InvalidRequest, NotFound
from gateway.engine.history import iso_seconds
from gateway.web.admin_auth import (
    ROLE_ADMIN,
    ROLE_OPERATOR,
    ROLE_VIEWER,
    actor_of,
    require_role,
)
from gateway.web.admin_view import NO_STORE
from gateway.web.appkeys import ENGINE, SETTINGS
from gateway.web.operations_view import read_operator_body
from gateway.web.resolve_body import StorableText

__all__ = ["ProbeCheck", "ProbeKinds", "TrustBody", "check_probe", "show_probe", "trust_probe"]

log = logging.getLogger("gateway.admin")


class ProbeKindState(BaseModel):
    """One request kind's calibration, as the store keeps it."""

    kind: str = Field(
        description="The request kind: method and path with every segment "
        "holding a digit as `*` (MCP: the tool)."
    )
    applies_to: str | None = Field(
        description="The `applies_to` entry that covers it, "
        'or null: the probe\'s "not found" never releases it.'
    )
    state: str = Field(
        description="`calibrated`, `blind` or `trusted` (an operator's "
        "override of a failing calibration, until `trusted_until`)."
    )
    at: str | None = Field(description="When the state was last set or confirmed.")
    sample_operation_id: str | None = Field(
        description="The completed operation the probe was last asked about."
    )
    detail: str
    trusted_until: str | None
    actor: str | None
    note: str | None
    events: list[dict[str, Any]] = Field(description="Its transitions, oldest first.")


class ProbeKinds(BaseModel):
    """A route's probe: what it is declared for and its calibration rows."""

    route: str
    applies_to: list[str]
    kinds: list[ProbeKindState]


class ProbeCheckRow(BaseModel):
    kind: str
    verdict: str = Field(
        description="`calibrated`, `blind`, `no-sample` (nothing of the kind "
        "completed to ask about), `error` (the probe failed), `not-declared` "
        "or `too-many-kinds`."
    )
    operation: str | None = Field(description="The operation the probe was asked about.")
    detail: str


class ProbeCheck(BaseModel):
    """What `probes check` found: one row per kind of the route's requests."""

    route: str
    results: list[ProbeCheckRow]


class TrustBody(BaseModel):
    """Re-enable a route's probe for one kind: the calibration runs again; if it still
    fails, the trust is an override for 24 hours. The note is required."""

    model_config = ConfigDict(extra="forbid")

    kind: str = Field(min_length=1, max_length=300)
    note: StorableText = Field(min_length=1, max_length=2000)


def _route(request: web.Request) -> RouteSettings:
    name = request.match_info["route"]
    route = next((r for r in request.app[SETTINGS].routes if r.name == name), None)
    if route is None:
        raise NotFound(f"no route named {name!r}")
    if route.probe is None:
        raise InvalidRequest(f"route {name!r} has no probe")
    return route


def _state(route: RouteSettings, row: Calibration, entry: str | None) -> ProbeKindState:
    return ProbeKindState(
        kind=row.kind,
        applies_to=entry,
        state=row.state.value,
        at=iso_seconds(row.at),
        sample_operation_id=row.sample,
        detail=row.detail,
        trusted_until=iso_seconds(row.until),
        actor=row.actor,
        note=row.note,
        events=[{**event, "at": iso_seconds(event.get("at"))} for event in row.events],
    )


def _check_row(run: CalibrationRun) -> ProbeCheckRow:
    return ProbeCheckRow(
        kind=run.kind, verdict=run.verdict, operation=run.sample, detail=run.detail
    )


async def show_probe(request: web.Request) -> web.Response:
    """The route's probe: its `applies_to` and every kind's calibration."""
    require_role(request, ROLE_VIEWER)
    route = _route(request)
    calibrator = request.app[ENGINE].calibrator
    rows = await calibrator.calibrations(route)
    assert route.probe is not None
    document = ProbeKinds(
        route=route.name,
        applies_to=list(route.probe.applies_to),
        kinds=[_state(route, row, calibrator.entry_of(route, row.kind)) for row in rows],
    )
    return web.json_response(document.model_dump(mode="json"), headers=NO_STORE)


async def check_probe(request: web.Request) -> web.Response:
    """Calibrate every kind of the route's requests now (a blind kind stays blind)."""
    require_role(request, ROLE_OPERATOR)
    route = _route(request)
    runs = await request.app[ENGINE].calibrator.check(route)
    document = ProbeCheck(route=route.name, results=[_check_row(run) for run in runs])
    return web.json_response(document.model_dump(mode="json"), headers=NO_STORE)


async def trust_probe(request: web.Request) -> web.Response:
    """Re-enable a blind probe for one kind, with a note (see `TrustBody`)."""
    require_role(request, ROLE_ADMIN)
    route = _route(request)
    actor = actor_of(request)
    raw = await read_operator_body(request)
    try:
        body = TrustBody.model_validate_json(raw or b"null")
    except ValidationError as exc:
        raise InvalidRequest(f"invalid trust request: {exc.errors()[0]['msg']}") from exc
    calibrator = request.app[ENGINE].calibrator
    if calibrator.entry_of(route, body.kind) is None:
        raise InvalidRequest(
            f"kind {body.kind!r} is not covered by route {route.name!r}'s applies_to: its probe "
            "never releases it, so there is nothing to trust"
        )
    run = await calibrator.trust(route, body.kind, note=body.note, actor=actor)
    if run.calibration is None:  # the route has as many kinds as it may keep
        raise InvalidRequest(run.detail)
    state = _state(route, run.calibration, calibrator.entry_of(route, body.kind))
    return web.json_response(state.model_dump(mode="json"), headers=NO_STORE)
