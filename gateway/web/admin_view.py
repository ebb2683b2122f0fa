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

from gateway.engine.errors import InvalidRequest, NotFound, NotResolvable, Unauthorized
from gateway.engine.models import Evidence, State
from gateway.engine.scopes import header_bytes
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
    try:
        page = await request.app[STORE].list_operations(
            state=state, limit=limit, cursor=query.get("cursor") or None
        )
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from exc
    document = {
        "items": [
            operation_json(op, lookup_url=operation_url(op.key), include_scope=True)
            for op in page.items
        ],
        "next_cursor": page.next_cursor,
    }
    return web.Response(body=json.dumps(document).encode(), content_type="application/json")


async def show_operation(request: web.Request) -> web.Response:
    require_admin(request)
    op_id = request.match_info["id"]
    operation = await request.app[STORE].get_by_id(op_id)
    if operation is None:
        raise NotFound(f"no operation with id {op_id!r}")
    return operation_response(operation, include_scope=True, key_headers=False)


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
    return operation_response(resolved, include_scope=True, key_headers=False)


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
    evidence = Evidence(
        at=time.time(), source="redaction", detail=f"receipt erased by admin: {body.reason}"
    )
    redacted = await store.redact(op_id, evidence)
    if redacted is None:
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
    return operation_response(redacted, include_scope=True, key_headers=False)
