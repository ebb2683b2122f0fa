"""Render every gateway error as RFC 9457 `application/problem+json`.

One middleware catches `GatewayError` (and anything unexpected) at the edge
of the application, so handlers raise and never format errors themselves.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from gateway.engine.errors import GatewayError, MethodNotAllowed, NotFound
from gateway.engine.headers import IDEMPOTENCY_KEY, IDEMPOTENCY_STATUS
from gateway.engine.keys import format_key_header, operation_url
from gateway.web.appkeys import TRACE

log = logging.getLogger("gateway.problems")

PROBLEM_JSON = "application/problem+json"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def problem_response(
    error: GatewayError, *, instance: str | None = None, request_id: str | None = None
) -> web.Response:
    """The problem+json answer for one error, with the key headers when a key is concerned."""
    document = problem_document(error, instance=instance, request_id=request_id)
    headers: dict[str, str] = {}
    if isinstance(error, MethodNotAllowed) and error.allow:
        headers["Allow"] = error.allow
    if error.retry_after is not None:
        headers["Retry-After"] = str(max(1, math.ceil(error.retry_after)))
    if error.key is not None:
        headers[IDEMPOTENCY_KEY] = format_key_header(error.key)
        if error.state is not None:
            headers[IDEMPOTENCY_STATUS] = error.state
    return web.Response(
        status=error.status,
        body=json.dumps(document).encode(),
        content_type=PROBLEM_JSON,
        headers=headers,
    )


def problem_document(
    error: GatewayError, *, instance: str | None = None, request_id: str | None = None
) -> dict[str, Any]:
    """The RFC 9457 document for one error (the MCP front end puts it in `_meta`).

    Only `detail` describes what went wrong; `error.internal` (hosts, driver
    text) never goes into it. `request_id` finds the log line that has it.
    """
    document: dict[str, Any] = {
        "type": error.type_uri,
        "title": error.title,
        "status": error.status,
        "detail": error.detail,
    }
    if instance:
        document["instance"] = instance
    if request_id:
        document["request_id"] = request_id
    if error.key is not None:
        document["key"] = error.key
        document["operation"] = operation_url(error.key)
    if error.state is not None:
        document["state"] = error.state
    if error.operation_id is not None:
        document["operation_id"] = error.operation_id
    if error.safe_to_retry is not None:
        document["safe_to_retry"] = error.safe_to_retry
    document["next_action"] = error.next_action
    document.update(error.extensions)
    return document


@web.middleware
async def problem_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except GatewayError as error:
        return _answer(request, error)
    except web.HTTPNotFound:
        return _answer(request, NotFound(f"nothing at {request.path}"))
    except web.HTTPMethodNotAllowed as exc:
        refusal = MethodNotAllowed(
            f"{request.method} is not allowed on {request.path}",
            allow=", ".join(sorted(exc.allowed_methods)),
        )
        return _answer(request, refusal)
    except web.HTTPException:
        raise
    except Exception:
        log.exception("unexpected error on %s %s", request.method, request.path)
        return _answer(request, GatewayError("the gateway hit an unexpected error; see its log"))


def _answer(request: web.Request, error: GatewayError) -> web.Response:
    request_id = log_internal(request, error)
    return problem_response(error, instance=request.path, request_id=request_id)


def log_internal(request: web.Request, error: GatewayError) -> str | None:
    """Log what the caller is never told (`error.internal`) on the request's line;
    return the request id that finds it."""
    trace = request.get(TRACE)
    request_id = trace.request_id if trace is not None else None
    if error.internal is not None:
        if trace is not None:
            trace.error = error.internal
        log.warning(
            "%s on %s %s: %s",
            error.problem_type,
            request.method,
            request.path,
            error.internal,
            extra={"event": "problem", "request_id": request_id, "error": error.internal},
        )
    return request_id
