"""The whole operation JSON: the record, its history, and what an operator decides from.

`gateway.web.operation_json` renders the record alone (what a listing shows
for each item). One operation's page adds its history, the recorded
request (operators only), where its receipt came from, and how long ago
its last send was and until when the tool may still apply it: the server's
reckoning, never a browser's clock.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from aiohttp import web

from gateway.engine.headers import IDEMPOTENCY_KEY, IDEMPOTENCY_STATUS
from gateway.engine.history import COMMITMENT, EventRow, event_json, request_of
from gateway.engine.keys import format_key_header, operation_url
from gateway.engine.models import RECEIPT_SOURCES, Operation, State
from gateway.web.appkeys import ENGINE, SETTINGS, STORE
from gateway.web.operation_json import iso, operation_json

HISTORY_PAGE = 200
"""Events an operation JSON carries; `history_next` pages on from there."""


async def operation_document(
    request: web.Request, operation: Operation, *, admin: bool
) -> dict[str, Any]:
    """The operation JSON for its owner (`admin=False`) or an operator."""
    page = await request.app[STORE].history(operation.id, limit=HISTORY_PAGE + 1)
    events, payloads = page.events[:HISTORY_PAGE], page.payloads[:HISTORY_PAGE]
    document = operation_json(
        operation, lookup_url=operation_url(operation.key), include_scope=admin
    )
    document["history"] = [
        event_json(event, payload, for_owner=not admin)
        for event, payload in zip(events, payloads, strict=True)
    ]
    document["history_next"] = events[-1].seq if len(page.events) > HISTORY_PAGE else None
    document["receipt_source"] = receipt_source(operation)
    # How often the key was asked about since: an agent that keeps retrying shows here.
    document["requests"] = (
        await request.app[STORE].request_log(operation.id, lines=False)
    ).counts()
    document.update(release_window_json(request, operation))
    if admin:
        document["request"] = request_json(events, payloads)
        document["probe_available"] = request.app[ENGINE].has_probe(operation.route)
        document["forwarded_key"] = forwarded_key(request, operation)
    elif not _note_shared(operation, document["history"]):
        resolution = document.get("resolution")
        if isinstance(resolution, dict):
            resolution["note"] = None
    return document


def document_response(
    document: dict[str, Any], operation: Operation, *, key_headers: bool
) -> web.Response:
    headers = {"ETag": operation.etag, "Cache-Control": "no-store"}
    if key_headers:
        headers[IDEMPOTENCY_KEY] = format_key_header(operation.key)
        headers[IDEMPOTENCY_STATUS] = operation.state.value
    return web.Response(
        body=json.dumps(document).encode(), content_type="application/json", headers=headers
    )


def receipt_source(operation: Operation) -> str | None:
    """Who made the receipt: the upstream's answer, a probe's, or an operator's statement."""
    if operation.state is not State.COMPLETED or operation.resolution is None:
        return None
    return RECEIPT_SOURCES.get(operation.resolution.by)


def release_window_json(request: web.Request, operation: Operation) -> dict[str, Any]:
    window = request.app[ENGINE].release_window(operation)
    if window is None:
        return {"last_send_age": None, "may_apply_until": None, "not_applied_allowed_at": None}
    until = iso(window.may_apply_until)
    return {
        "last_send_age": round(max(0.0, operation.observed_at - window.sent_at), 3),
        "may_apply_until": until,
        "not_applied_allowed_at": until if operation.state is State.UNKNOWN else None,
    }


def request_json(events: Sequence[EventRow], payloads: Sequence[bytes | None]) -> Any:
    """The recorded request (from the first `claimed` event), or what became of it."""
    for event, payload in zip(events, payloads, strict=True):
        if event.type != "claimed" or f'"request{COMMITMENT}"' not in event.data:
            continue
        kept = request_of(payload)
        if kept is not None:
            return kept
        gone = "redacted" if any(e.type == "redacted" for e in events) else "expired"
        return {"body": None, "arguments": None, "body_gone": gone}
    return None


def forwarded_key(request: web.Request, operation: Operation) -> str | None:
    route = next((r for r in request.app[SETTINGS].routes if r.name == operation.route), None)
    return None if route is None else request.app[ENGINE].forwarded_key(route, operation)


def _note_shared(operation: Operation, history: list[dict[str, Any]]) -> bool:
    """An owner reads the latest resolution's note unless an admin wrote it unshared."""
    if operation.resolution is None or operation.resolution.by != "admin":
        return True
    resolved = [event for event in history if event["type"] == "resolved"]
    return bool(resolved) and bool(resolved[-1].get("share_with_owner"))
