"""The operation JSON of `GET /operations/<key>`, with field names fixed by the contract."""

from __future__ import annotations

import base64
from typing import Any

from gateway.engine.history import iso_seconds
from gateway.engine.models import Operation, State, StoredResponse
from gateway.mcp.replies import TOOL_CALL, receipt_json

iso = iso_seconds


def safe_to_retry(operation: Operation) -> bool:
    """Would sending the same request with the same key again be safe and useful?

    False where a retry can never succeed without reconciliation: an `unknown`
    outcome, or a completed operation whose response is gone.
    """
    if operation.state is State.UNKNOWN:
        return False
    if operation.state is State.COMPLETED:
        return operation.receipt_available()
    return True


def response_json(response: StoredResponse) -> dict[str, Any]:
    headers: dict[str, str] = {}
    for name, value in response.headers:
        lower = name.lower()
        headers[lower] = f"{headers[lower]}, {value}" if lower in headers else value
    try:
        body, encoding = response.body.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        body, encoding = base64.b64encode(response.body).decode("ascii"), "base64"
    return {"status": response.status, "headers": headers, "body": body, "body_encoding": encoding}


def operation_json(
    operation: Operation, *, lookup_url: str | None = None, include_scope: bool = False
) -> dict[str, Any]:
    """Render an operation for callers and operators; expiry is judged on the store's
    clock (`observed_at`), so every replica renders a record alike.

    >>> # operation_json(op)["state"]
    >>> # 'completed'
    """
    response = (
        response_json(operation.response)
        if operation.response is not None and operation.receipt_available()
        else None
    )
    resolution = operation.resolution
    document: dict[str, Any] = {
        "id": operation.id,
        "key": operation.key,
        "state": operation.state.value,
        "route": operation.route,
        "method": operation.method,
        "path": operation.path,
        "fingerprint": operation.fingerprint,
        "attempts": operation.attempts,
        "created_at": iso(operation.created_at),
        "updated_at": iso(operation.updated_at),
        "expires_at": iso(operation.expires_at),
        "forgotten_at": iso(operation.forgotten_at),
        "response": response,
        "response_status": operation.response.status if operation.response else None,
        # Whether the body is held now: false once retention dropped it, as well as for a
        # body too large to keep or erased by a redaction (`response_status` stays).
        "body_retained": operation.receipt_available()
        if operation.state is State.COMPLETED
        else None,
        "resolution": (
            {"by": resolution.by, "at": iso(resolution.at), "note": resolution.note}
            if resolution
            else None
        ),
        "evidence": [
            {
                "at": iso(item.at),
                "source": item.source,
                "detail": item.detail,
                "status": item.status,
                "body_sha256": item.body_sha256,
            }
            for item in operation.evidence
        ],
        # A completed outcome is final: no grace counts from its last lease (the record
        # keeps it for the states that can still be released).
        "lease_expires_at": (
            None if operation.state is State.COMPLETED else iso(operation.lease_expires_at)
        ),
        "fencing_token": operation.token,
        "safe_to_retry": safe_to_retry(operation),
    }
    if operation.method == TOOL_CALL:
        # An MCP operation's receipt is the tool result (or the server's error).
        del document["response"]
        kept = operation.response if operation.receipt_available() else None
        document.update(receipt_json(kept) if kept is not None else {"result": None})
    if lookup_url is not None:
        document["operation"] = lookup_url
    if include_scope:
        document["scope"] = operation.scope
    return document
