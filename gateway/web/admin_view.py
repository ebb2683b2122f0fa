"""`/admin/operations`: every scope's operations, for operators holding the admin token.

Answers 404 when no admin token is configured (the endpoints do not exist),
401 on a missing or wrong token; the token is compared in constant time.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gateway.config.units import parse_duration
from gateway.engine.errors import (
    InvalidRequest,
    NotFound,
    NotResolvable,
    PreconditionFailed,
)
from gateway.engine.history import (
    OPERATOR,
    ChainReport,
    RowFacts,
    event_json,
    verify_chain,
    verify_checkpoints,
)
from gateway.engine.keys import operation_url
from gateway.engine.lifecycle_events import redacted_event
from gateway.engine.models import Evidence, Operation, State
from gateway.store import OperationFilter
from gateway.web.admin_auth import (
    ROLE_ADMIN,
    ROLE_OPERATOR,
    ROLE_VIEWER,
    actor_of,
    require_role,
)
from gateway.web.appkeys import ENGINE, PROBE_JOBS, SETTINGS, STORE
from gateway.web.operation_document import HISTORY_PAGE, forwarded_key
from gateway.web.operation_json import operation_json
from gateway.web.operations_view import expected_version, operation_response, read_operator_body
from gateway.web.probe_jobs import PARALLEL, job_url
from gateway.web.resolve_body import StorableText, parse_attach_body, parse_resolve_body

log = logging.getLogger("gateway.admin")

MAX_LIMIT = 500
DEFAULT_LIMIT = 100
NO_STORE = {"Cache-Control": "no-store"}


async def _admin_response(request: web.Request, operation: Operation) -> web.Response:
    """One operation for an operator: any scope, its history, the request and the key its
    upstream saw."""
    return await operation_response(request, operation, admin=True)


async def _operation_by_id(request: web.Request) -> Operation:
    op_id = request.match_info["id"]
    operation = await request.app[STORE].get_by_id(op_id)
    if operation is None:
        raise NotFound(f"no operation with id {op_id!r}")
    return operation


async def list_operations(request: web.Request) -> web.Response:
    require_role(request, ROLE_VIEWER)
    query = request.rel_url.query
    state_name = query.get("state")
    try:
        state = State(state_name) if state_name else None
    except ValueError as exc:
        states = ", ".join(s.value for s in State)
        raise InvalidRequest(f"state must be one of {states}") from exc
    try:
        limit = int(query.get("limit", DEFAULT_LIMIT))
    except ValueError as exc:
        raise InvalidRequest("limit must be an integer") from exc
    if not 1 <= limit <= MAX_LIMIT:
        raise InvalidRequest(f"limit must be between 1 and {MAX_LIMIT}")
    older_than = _older_than(query.get("older_than"))
    text = query.get("q") or None
    where = OperationFilter(
        state=state,
        route=query.get("route") or None,
        key=query.get("key") or None,
        older_than=older_than,
        prefix=text,
    )
    cursor = query.get("cursor") or None
    store = request.app[STORE]
    try:
        page = await store.list_operations(where, limit=limit, cursor=cursor)
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from exc
    items = list(page.items)
    if text is not None and ":" in text and cursor is None:
        # A forwarded key is `<label>:<key>` (scoped mode): search its key part, and keep
        # the operations whose forwarded key really starts with the text.
        rest = text.partition(":")[2]
        more = await store.list_operations(
            dataclasses.replace(where, prefix=rest), limit=limit, cursor=None
        )
        seen = {op.id for op in items}
        items.extend(
            op
            for op in more.items
            if op.id not in seen and (forwarded_key(request, op) or "").startswith(text)
        )
    document = {
        "items": [
            {
                **operation_json(op, lookup_url=operation_url(op.key), include_scope=True),
                "forwarded_key": forwarded_key(request, op),
            }
            for op in items
        ],
        "next_cursor": page.next_cursor,
    }
    return web.Response(
        body=json.dumps(document).encode(),
        content_type="application/json",
        headers=NO_STORE,
    )


def _older_than(value: str | None) -> float | None:
    """`older_than=10m` (or seconds): only operations created at least that long ago."""
    if not value:
        return None
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise InvalidRequest(f"older_than: {exc}") from exc


async def overview(request: web.Request) -> web.Response:
    """What the console's first screen needs: counts by state and the route names."""
    identity = require_role(request, ROLE_VIEWER)
    counts = await request.app[STORE].count_by_state()
    document = {
        "counts": {state.value: counts.get(state, 0) for state in State},
        "routes": [route.name for route in request.app[SETTINGS].routes],
        # Who the token says the caller is: the console shows it, and what it may do.
        "you": {"name": identity.name, "role": identity.role, "actor": actor_of(request)},
    }
    return web.Response(
        body=json.dumps(document).encode(),
        content_type="application/json",
        headers={"Cache-Control": "no-store"},
    )


async def show_operation(request: web.Request) -> web.Response:
    require_role(request, ROLE_VIEWER)
    return await _admin_response(request, await _operation_by_id(request))


async def resolve_operation(request: web.Request) -> web.Response:
    """Settle any scope's unknown operation; `force` releases despite `too-early`, on the
    record, and `share_with_owner` lets the owner read the note."""
    require_role(request, ROLE_OPERATOR)
    actor = actor_of(request)
    body = parse_resolve_body(await read_operator_body(request))
    if body.force:
        require_role(request, ROLE_ADMIN, doing="a forced release needs the role 'admin'")
    operation = await _operation_by_id(request)
    resolved = await request.app[ENGINE].resolve(
        operation,
        outcome=body.outcome,
        by="admin",
        response=body.receipt_for(operation),
        note=body.note,
        expected_version=expected_version(request, operation),
        actor=actor,
        force=body.force,
        share_with_owner=body.share_with_owner,
    )
    return await _admin_response(request, resolved)


async def attach_receipt(request: web.Request) -> web.Response:
    """Attach the receipt an `applied` settlement went without (retries got `409
    receipt-not-retained`), once; the history says who, when and why."""
    require_role(request, ROLE_OPERATOR)
    actor = actor_of(request)
    body = parse_attach_body(await read_operator_body(request))
    operation = await _operation_by_id(request)
    attached = await request.app[ENGINE].attach(
        operation,
        body.receipt_for(operation),
        note=body.note,
        actor=actor,
        expected_version=expected_version(request, operation),
        share_with_owner=body.share_with_owner,
    )
    return await _admin_response(request, attached)


class RedactBody(BaseModel):
    """Why the stored request and receipt are erased: kept in the history (erasable too)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    reason: StorableText = Field(min_length=1, max_length=2000)


async def redact_operation(request: web.Request) -> web.Response:
    """Erase an operation's recorded request and any receipt's headers and body (personal
    data), in any state; the key stays used, the history says who erased what and why."""
    require_role(request, ROLE_ADMIN)
    actor = actor_of(request)
    raw = await read_operator_body(request)
    try:
        body = RedactBody.model_validate_json(raw or b"null")
    except ValidationError as exc:
        raise InvalidRequest(f"invalid redact request: {exc.errors()[0]['msg']}") from exc
    store = request.app[STORE]
    operation = await _operation_by_id(request)
    version = expected_version(request, operation)
    erased = ["request", "probes"]
    if operation.state is State.COMPLETED:
        erased.append("receipt")
    evidence = Evidence(
        at=time.time(), source="redaction", detail=f"{', '.join(erased)} erased by {OPERATOR}"
    )
    event = redacted_event(actor=actor, reason=body.reason, erased=erased)
    redacted = await store.redact(operation.id, evidence, expected_version=version, events=(event,))
    if redacted is None:
        current = await store.get_by_id(operation.id) or operation
        raise PreconditionFailed(
            "the operation changed since it was read (If-Match); read it again",
            key=current.key,
            state=current.state.value,
            operation_id=operation.id,
        )
    log.info(
        "redacted",
        # The reason may name a person (it is an erasable field): its length only.
        extra={"event": "redaction", "operation_id": operation.id, "actor": actor,
               "reason_length": len(body.reason)},
    )  # fmt: skip
    return await _admin_response(request, redacted)


async def probe_operation(request: web.Request) -> web.Response:
    """Probe one unknown operation now (**Probe now**), whatever its backoff says."""
    require_role(request, ROLE_OPERATOR)
    operation = await _operation_by_id(request)
    if not request.app[ENGINE].has_probe(operation.route):
        raise InvalidRequest(f"route {operation.route!r} has no probe")
    if operation.state is not State.UNKNOWN:
        raise NotResolvable(
            f"the operation is {operation.state.value}; only an unknown one is probed",
            key=operation.key,
            state=operation.state.value,
            operation_id=operation.id,
        )
    probed = await request.app[ENGINE].probe(operation, now=True)
    return await _admin_response(request, probed or operation)


async def probe_route(request: web.Request) -> web.Response:
    """Start (or show) the bulk probe of every unknown operation of `?route=`: 202."""
    require_role(request, ROLE_OPERATOR)
    name = request.rel_url.query.get("route", "")
    route = next((r for r in request.app[SETTINGS].routes if r.name == name), None)
    if route is None:
        raise InvalidRequest(f"no route named {name!r}: give ?route=<name>")
    if route.probe is None:
        raise InvalidRequest(f"route {name!r} has no probe")
    job = request.app[PROBE_JOBS].start(
        name, request.app[STORE], request.app[ENGINE], min(PARALLEL, route.max_concurrency)
    )
    return web.json_response(
        job.as_json(), status=202, headers={**NO_STORE, "Location": job_url(name)}
    )


async def probe_job(request: web.Request) -> web.Response:
    require_role(request, ROLE_VIEWER)
    job = request.app[PROBE_JOBS].get(request.match_info["route"])
    if job is None:
        raise NotFound(f"no probe job for route {request.match_info['route']!r}")
    return web.json_response(job.as_json(), headers=NO_STORE)


async def operation_history(request: web.Request) -> web.Response:
    """A page of one operation's history: `?after=<seq>&limit=<n>`."""
    require_role(request, ROLE_VIEWER)
    operation = await _operation_by_id(request)
    after = _int_param(request, "after", 0, minimum=0)
    limit = _int_param(request, "limit", HISTORY_PAGE, minimum=1, maximum=1000)
    page = await request.app[STORE].history(operation.id, after=after, limit=limit + 1)
    events = [
        event_json(event, payload, for_owner=False)
        for event, payload in zip(page.events[:limit], page.payloads[:limit], strict=True)
    ]
    more = len(page.events) > limit
    document = {"items": events, "next": events[-1]["seq"] if more and events else None}
    return web.json_response(document, headers=NO_STORE)


async def operation_requests(request: web.Request) -> web.Response:
    """The key's request log: its first and last lines (oldest first) and the counts."""
    require_role(request, ROLE_VIEWER)
    operation = await _operation_by_id(request)
    log_kept = await request.app[STORE].request_log(operation.id)
    return web.json_response(log_kept.as_json(), headers=NO_STORE)


async def verify_operation(request: web.Request) -> web.Response:
    """Check one operation's hash chain: intact, or the first broken event."""
    require_role(request, ROLE_VIEWER)
    operation = await _operation_by_id(request)
    return web.json_response(await _verified(request, operation), headers=NO_STORE)


async def verify_all(request: web.Request) -> web.Response:
    """Check the chains of every operation, a page at a time (`?cursor=&limit=`); the
    first page also checks the chain of checkpoints (`checkpoints`)."""
    require_role(request, ROLE_VIEWER)
    limit = _int_param(request, "limit", DEFAULT_LIMIT, minimum=1, maximum=MAX_LIMIT)
    cursor = request.rel_url.query.get("cursor") or None
    try:
        page = await request.app[STORE].list_operations(
            OperationFilter(), limit=limit, cursor=cursor
        )
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from exc
    broken, redacted = [], 0
    for operation in page.items:
        report = await _verified(request, operation)
        redacted += len(report["redacted"])
        if not report["ok"]:
            broken.append({key: report[key] for key in ("id", "key", "scope")} | report["broken"])
    document: dict[str, Any] = {
        "checked": len(page.items),
        "redacted_events": redacted,
        "broken": broken,
        "next_cursor": page.next_cursor,
    }
    if cursor is None:
        document["checkpoints"] = await _checkpoints_verified(request)
    return web.json_response(document, headers=NO_STORE)


async def _verified(request: web.Request, operation: Operation) -> dict[str, Any]:
    store = request.app[STORE]
    evidence = await store.chain_evidence(operation.id)
    if evidence is None:  # forgotten since it was listed: nothing left to check
        report = ChainReport(0)
    else:
        seal = store.history_seal()
        current = evidence.operation
        report = verify_chain(
            evidence.page.events,
            head=current.history_head,
            head_seq=current.history_seq,
            payloads=evidence.page.payloads,
            key=None if seal is None else seal.key,
            keyed_from=evidence.keyed_from,
            row=RowFacts(current.version, current.attempts, current.state.value),
            checkpoint=evidence.checkpoint,
            operation_id=current.id,
        )
    return {"id": operation.id, "key": operation.key, "scope": operation.scope} | report.as_json()


async def _checkpoints_verified(request: web.Request) -> dict[str, Any]:
    """The chain of checkpoints: each signed, each linking to the one before."""
    store = request.app[STORE]
    seal = store.history_seal()
    if seal is None:
        return {"ok": True, "count": 0, "latest_at": None, "broken": None}
    entries = await store.checkpoint_log()
    report = verify_checkpoints(entries, seal.key)
    return report


def _int_param(
    request: web.Request, name: str, default: int, *, minimum: int, maximum: int = 2**62
) -> int:
    raw = request.rel_url.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise InvalidRequest(f"{name} must be an integer") from exc
    if not minimum <= value <= maximum:
        raise InvalidRequest(f"{name} must be between {minimum} and {maximum}")
    return value
