"""Which MCP protocol generation a request speaks, and what its results must carry.

Both generations share one endpoint and are told apart per request by the
`MCP-Protocol-Version` header (absent before a session-based client has
negotiated one). Versions are dates, so they order as strings.

From 2026-07-28 every result names its kind in `resultType` ("complete" for a
final answer, "input_required" for a multi-round call's question); the SDKs
of that generation validate it and raise on a result without one. A server's
own results come with it; the results the gateway writes itself (refusals,
the status tool, replays of a receipt recorded in the other generation) must
be given it here, or the agent gets a validation error instead of the answer
that tells it not to call again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "PROTOCOL_VERSION_HEADER",
    "RESULT_TYPE_SINCE",
    "complete_result",
    "needs_result_type",
    "protocol_version",
]

PROTOCOL_VERSION_HEADER = "MCP-Protocol-Version"
RESULT_TYPE_SINCE = "2026-07-28"
"""The first version whose results must carry `resultType`."""

_COMPLETE = "complete"


def protocol_version(headers: Mapping[str, str]) -> str | None:
    """The version the request says it speaks; None when it says none (or garbage).

    >>> protocol_version({"MCP-Protocol-Version": "2026-07-28"})
    '2026-07-28'
    >>> protocol_version({"MCP-Protocol-Version": "latest"}) is None
    True
    """
    value = headers.get(PROTOCOL_VERSION_HEADER)
    if value is None:
        return None
    value = value.strip()
    digits = value.replace("-", "")
    if len(value) != 10 or len(digits) != 8 or not digits.isdigit():
        return None
    return value


def needs_result_type(version: str | None) -> bool:
    """Whether results of this version must carry `resultType`.

    >>> needs_result_type("2025-11-25"), needs_result_type("2026-07-28"), needs_result_type(None)
    (False, True, False)
    """
    return version is not None and version >= RESULT_TYPE_SINCE


def complete_result(result: dict[str, Any], version: str | None) -> dict[str, Any]:
    """`result` as a final answer valid for `version`: given `resultType: "complete"`
    when that version requires one and the result has none (one it has is kept).

    >>> complete_result({"content": []}, "2026-07-28")
    {'content': [], 'resultType': 'complete'}
    >>> complete_result({"content": []}, "2025-11-25")
    {'content': []}
    """
    if needs_result_type(version) and "resultType" not in result:
        result["resultType"] = _COMPLETE
    return result
