"""`/admin/operations`: every scope's operations, for operators holding the admin token.

Answers 404 when no admin token is configured (the endpoints do not exist),
401 on a missing or wrong token; the token is compared in constant time.
"""

from __future__ import annotations

import hmac
import json
import logging
import time

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gateway.config.units import parse_duration
from gateway.engine.errors import (
    InvalidRequest,
    NotFound,
    NotResolvable,
    PreconditionFailed,
    Unauthorized,
)
from gateway.engine.models import Evidence, Operation, State
from gateway.engine.scopes import header_bytes
from gateway.store import OperationFilter
from gateway.web.appkeys import ENGINE, SETTINGS, STORE
from gateway.web.operation_json import operation_json
from gateway.web.operations_view import expected_version, operation_response, read_operator_body
from gateway.web.problems import operation_url
from gateway.web.resolve_body import StorableText, parse_resolve_body

log = logging.getLogger("gateway.admin")

MAX_LIMIT = 500
DEFAULT_LIMIT = 100


def require_admin(request: web.Request) -> None:
    token = request.app[SETTINGS].admin.token.get_secret_value()
    if not token:
        raise NotFound("the admin endpoints are disabled (no admin token is configured)")
    scheme, _, offered = request.headers.get("Authorization", "").strip().partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        header_bytes(offered.strip()), token.encode()
    ):
        raise Unauthorized("a valid 'Authorization: Bearer <admin token>' is required")


def _forwarded_key(request: web.Request, operation: Operation) -> str | None:
    route = next((r for r in request.app[SETTINGS].routes if r.name == operation.route), None)
    return None if route is None else request.app[ENGINE].forwarded_key(route, operation)


def _admin_response(request: web.Request, operation: Operation) -> web.Response:
    """One operation for an operator: any scope, and the key its upstream saw."""
    return operation_response(
        operation,
        include_scope=True,
        key_headers=False,
        extra={"forwarded_key": _forwarded_key(request, operation)},
    )


async def list_operations(request: web.Request) -> web.Response:
    require_admin(request)
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
    try:
        page = await request.app[STORE].list_operations(
            OperationFilter(
                state=state,
                route=query.get("route") or None,
                key=query.get("key") or None,
                older_than=older_than,
            ),
            limit=limit,
            cursor=query.get("cursor") or None,
        )
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from exc
    document = {
        "items": [
            {
                **operation_json(op, lookup_url=operation_url(op.key), include_scope=True),
                "forwarded_key": _forwarded_key(request, op),
            }
            for op in page.items
        ],
        "next_cursor": page.next_cursor,
    }
    return web.Response(body=json.dumps(document).encode(), content_type="application/json")


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
    require_admin(request)
    counts = await request.app[STORE].count_by_state()
    document = {
        "counts": {state.value: counts.get(state, 0) for state in State},
        "routes": [route.name for route in request.app[SETTINGS].routes],
    }
    return web.Response(
        body=json.dumps(document).encode(),
        content_type="application/json",
        headers={"Cache-Control": "no-store"},
    )


async def show_operation(request: web.Request) -> web.Response:
    require_admin(request)
    op_id = request.match_info["id"]
    operation = await request.app[STORE].get_by_id(op_id)
    if operation is None:
        raise NotFound(f"no operation with id {op_id!r}")
    return _admin_response(request, operation)


async def resolve_operation(request: web.Request) -> web.Response:
    require_admin(request)
    op_id = request.match_info["id"]
    body = parse_resolve_body(await read_operator_body(request))
    operation = await request.app[STORE].get_by_id(op_id)
    if operation is None:
        raise NotFound(f"no operation with id {op_id!r}")
    resolved = await request.app[ENGINE].resolve(
        operation,
        outcome=body.outcome,
        by="admin",
        response=body.receipt_for(operation),
        note=body.note,
        expected_version=expected_version(request, operation),
    )
    return _admin_response(request, resolved)


class RedactBody(BaseModel):
    """Why the receipt is erased: kept in the audit trail."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    reason: StorableText = Field(min_length=1, max_length=2000)


async def redact_operation(request: web.Request) -> web.Response:
    """Erase a completed receipt's headers and body (personal data); the key stays used."""
    require_admin(request)
    op_id = request.match_info["id"]
    raw = await read_operator_body(request)
    try:
        body = RedactBody.model_validate_json(raw or b"null")
    except ValidationError as exc:
        raise InvalidRequest(f"invalid redact request: {exc.errors()[0]['msg']}") from exc
    store = request.app[STORE]
    operation = await store.get_by_id(op_id)
    if operation is None:
        raise NotFound(f"no operation with id {op_id!r}")
    version = expected_version(request, operation)
    evidence = Evidence(
        at=time.time(), source="redaction", detail=f"receipt erased by admin: {body.reason}"
    )
    redacted = await store.redact(op_id, evidence, expected_version=version)
    if redacted is None:
        current = await store.get_by_id(op_id) or operation
        if version is not None and current.version != version:
            raise PreconditionFailed(
                "the operation changed since it was read (If-Match); read it again",
                key=current.key,
                state=current.state.value,
                operation_id=op_id,
            )
        operation = current
        raise NotResolvable(
            f"the operation is {operation.state.value}; only a completed receipt can be redacted",
            key=operation.key,
            state=operation.state.value,
            operation_id=op_id,
        )
    log.info(
        "redacted",
        extra={"event": "redaction", "operation_id": op_id, "reason": body.reason},
    )
    return _admin_response(request, redacted)
