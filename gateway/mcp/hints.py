"""Which tools a route's MCP server says are read-only.

With `trust_read_only_hint = true` (the default) a tool that the server's own
`tools/list` answer marks `annotations.readOnlyHint: true` is exempt from
`require_key` and `derive_key`: reading twice does no harm, and refusing a
key-less read would break clients that never send keys. A call that carries
a key is protected whatever the hint says.

Hints are learned per route, only from that route's own `tools/list`
answers as they pass through, never from a caller, and are bounded: a
server that lists more tools than `MAX_TOOLS` keeps the first ones.
"""

from __future__ import annotations

from typing import Any

from gateway.mcp.jsonrpc import JsonRpcError, parse_message
from gateway.mcp.sse import SseDecoder

__all__ = ["MAX_LISTING_BYTES", "MAX_TOOLS", "ReadOnlyHints", "ToolListing"]

MAX_TOOLS = 10_000
MAX_LISTING_BYTES = 4 << 20
"""A `tools/list` answer larger than this is passed on without learning from it."""


class ReadOnlyHints:
    """Per route: tool name -> the server's latest `readOnlyHint`.

    >>> hints = ReadOnlyHints()
    >>> hints.learn("r", {"tools": [{"name": "get", "annotations": {"readOnlyHint": True}}]})
    >>> hints.read_only("r", "get"), hints.read_only("r", "put")
    (True, False)
    """

    def __init__(self) -> None:
        self._routes: dict[str, dict[str, bool]] = {}

    def read_only(self, route: str, tool: str) -> bool:
        return self._routes.get(route, {}).get(tool, False)

    def listed(self, route: str, tool: str) -> bool:
        """Whether the route's server has listed a tool of this name."""
        return tool in self._routes.get(route, {})

    def learn(self, route: str, result: dict[str, Any]) -> None:
        tools = result.get("tools")
        if not isinstance(tools, list):
            return
        known = self._routes.setdefault(route, {})
        for tool in tools:
            if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
                continue
            if tool["name"] not in known and len(known) >= MAX_TOOLS:
                continue
            annotations = tool.get("annotations")
            hint = isinstance(annotations, dict) and annotations.get("readOnlyHint") is True
            known[tool["name"]] = hint


class ToolListing:
    """Watches the bytes of one `tools/list` answer pass by (JSON or SSE) and
    yields its `result` once complete; never changes what passes."""

    def __init__(self, request_id: object, *, stream: bool) -> None:
        self._id = request_id
        self._decoder = SseDecoder() if stream else None
        self._body = bytearray()
        self._result: dict[str, Any] | None = None
        self._overflow = False

    def feed(self, chunk: bytes) -> None:
        if self._result is not None or self._overflow:
            return
        if self._decoder is None:
            self._body += chunk
            self._overflow = len(self._body) > MAX_LISTING_BYTES
            return
        for event in self._decoder.feed(chunk):
            self._take(event.data.encode())

    def result(self) -> dict[str, Any] | None:
        if self._result is None and self._decoder is None and not self._overflow:
            self._take(bytes(self._body))
        return self._result

    def _take(self, data: bytes) -> None:
        try:
            message = parse_message(data)
        except JsonRpcError:
            return
        result = message.document.get("result")
        if message.kind == "response" and message.id == self._id and isinstance(result, dict):
            self._result = result
