"""What an operator sees of a request: recorded with its operation, secrets taken out.

To settle an `unknown` operation by hand, an operator must know which effect
to look for in the tool (which ticket, which refund): the request says. It
is recorded with the first attempt, erasable and sealed like a receipt, and
capped (`record_request_max`): a larger body keeps its size and SHA-256
only. Values that name secrets (`redact_request`: query parameters, JSON
members at any depth, JSON pointers) are replaced before anything is kept.

>>> record = http_record(method="POST", target="/v1/refunds?api_key=s3cret&x=1",
...     content_type="application/json", body=b'{"amount": 5, "token": "t"}',
...     limit=1024, redact=("api_key", "token"))
>>> record["target"], record["body"]
('/v1/refunds?api_key=%5Bredacted%5D&x=1', '{"amount":5,"token":"[redacted]"}')
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Sequence
from typing import Any
from urllib.parse import parse_qsl, urlencode

__all__ = ["REDACTED", "http_record", "mcp_record", "redacted_arguments", "redacted_target"]

REDACTED = "[redacted]"


def http_record(
    *,
    method: str,
    target: str,
    content_type: str | None,
    body: bytes,
    limit: int,
    redact: Sequence[str],
) -> dict[str, Any] | None:
    """The record of a plain HTTP request, or None when the route records none."""
    if limit <= 0:
        return None
    names = {name.lower() for name in redact if not name.startswith("/")}
    pointers = [name for name in redact if name.startswith("/")]
    record: dict[str, Any] = {
        "method": method,
        "target": _redacted_target(target, names),
        "content_type": content_type,
        "size": len(body),
        "sha256": hashlib.sha256(body).hexdigest(),
    }
    if len(body) > limit:
        return {**record, "body": None, "body_gone": "too_large"}
    kept = _redacted_json(body, names, pointers) if _is_json(content_type) else None
    if kept is not None:
        return {**record, "body": kept, "body_encoding": "utf-8"}
    try:
        return {**record, "body": body.decode(), "body_encoding": "utf-8"}
    except UnicodeDecodeError:
        return {**record, "body": base64.b64encode(body).decode(), "body_encoding": "base64"}


def mcp_record(
    *, tool: str, arguments: Any, size: int, limit: int, redact: Sequence[str]
) -> dict[str, Any] | None:
    """The record of an MCP tool call: the tool and its arguments."""
    if limit <= 0:
        return None
    record: dict[str, Any] = {"method": "tools/call", "tool": tool, "size": size}
    if size > limit:
        return {**record, "arguments": None, "body_gone": "too_large"}
    names = {name.lower() for name in redact if not name.startswith("/")}
    pointers = [name for name in redact if name.startswith("/")]
    try:
        return {**record, "arguments": _redact_value(arguments, names, pointers, "")}
    except RecursionError:  # nested deeper than anyone reads: size and name only
        return {**record, "arguments": None, "body_gone": "too_large"}


def redacted_target(target: str, redact: Sequence[str]) -> str:
    """A path and query with the values of `redact`'s query names replaced (a probe's
    request as the history shows it)."""
    return _redacted_target(target, {name.lower() for name in redact if not name.startswith("/")})


def redacted_arguments(arguments: Any, redact: Sequence[str]) -> Any:
    """Tool arguments with `redact`'s member names and pointers replaced."""
    names = {name.lower() for name in redact if not name.startswith("/")}
    pointers = [name for name in redact if name.startswith("/")]
    return _redact_value(arguments, names, pointers, "")


def _is_json(content_type: str | None) -> bool:
    if not content_type:
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


def _redacted_target(target: str, names: set[str]) -> str:
    path, separator, query = target.partition("?")
    if not separator or not names:
        return target
    pairs = parse_qsl(query, keep_blank_values=True)
    if not any(name.lower() in names for name, _ in pairs):
        return target
    return path + "?" + urlencode([(n, REDACTED if n.lower() in names else v) for n, v in pairs])


def _redacted_json(body: bytes, names: set[str], pointers: list[str]) -> str | None:
    """The body with secret values replaced, or None when it is not JSON."""
    try:
        document = json.loads(body)
        redacted = _redact_value(document, names, pointers, "")
    except (ValueError, RecursionError):
        return None
    if redacted == document:
        return body.decode("utf-8", errors="replace")
    return json.dumps(redacted, separators=(",", ":"), ensure_ascii=False)


def _redact_value(value: Any, names: set[str], pointers: list[str], at: str) -> Any:
    if at and at in pointers:
        return REDACTED
    if isinstance(value, dict):
        return {
            key: REDACTED
            if str(key).lower() in names
            else _redact_value(item, names, pointers, f"{at}/{_escape(str(key))}")
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [_redact_value(item, names, pointers, f"{at}/{i}") for i, item in enumerate(value)]
    return value


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")
