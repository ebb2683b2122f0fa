"""Telling a gateway problem from an upstream answer, and turning it into an exception.

An upstream may answer `application/problem+json` too; only a problem whose
`type` URI is under the gateway's base is the gateway's own. A replayed
receipt is never a gateway problem, whatever its body.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from idempotency_gateway_client._backoff import parse_retry_after
from idempotency_gateway_client._exceptions import PROBLEM_CLASSES, GatewayProblem

__all__ = ["PROBLEM_BASE_URI", "PROBLEM_JSON", "problem_from"]

PROBLEM_BASE_URI = "https://idempotency-gateway.dev/problems/"
PROBLEM_JSON = "application/problem+json"


def problem_from(status: int, headers: Mapping[str, str], body: bytes) -> GatewayProblem | None:
    """The typed exception for a gateway problem answer, or None for any other answer.

    >>> problem_from(422, {"Content-Type": "application/problem+json"}, body)
    KeyMismatch(status=422, problem_type='key-mismatch', key='k1', ...)
    """
    if headers.get("Idempotent-Replayed", "").lower() == "true":
        return None
    content_type = headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
    if content_type != PROBLEM_JSON:
        return None
    document = _json_object(body)
    if document is None:
        return None
    type_uri = document.get("type")
    if not isinstance(type_uri, str) or not type_uri.startswith(PROBLEM_BASE_URI):
        return None
    kind = type_uri[len(PROBLEM_BASE_URI) :].strip("/")
    cls = PROBLEM_CLASSES.get(kind, GatewayProblem)
    return cls(document, status=status, retry_after=parse_retry_after(headers.get("Retry-After")))


def _json_object(body: bytes) -> dict[str, Any] | None:
    try:
        document = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return document if isinstance(document, dict) else None
