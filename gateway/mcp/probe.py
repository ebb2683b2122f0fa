"""An MCP route's probe: one read-only tool call, on a session of its own.

MCP has no way to ask "did this call happen?", but a server that records
what it did can answer it with a tool of its own (`find_ticket` looking a
ticket up by the key its call carried). `[routes.probe]` on an MCP route
names that tool, its arguments (with `{forwarded_key}` and the like in their
strings) and `applied_pointer`, the boolean in the result's
`structuredContent` that says whether the effect exists.

The call is the gateway's, never a caller's: it opens a session of its own
(`initialize`, `notifications/initialized`, the `tools/call`, then a
best-effort DELETE), with the route's `upstream_headers` and the probe's own
`headers` only, so no caller's credential or session is ever reused. A
server that refuses `initialize` (one that speaks only the stateless
2026-07-28 generation) is asked in one stateless request instead. Every
request goes through the route's forwarder (its TLS, timeouts and pool);
the whole probe is bounded by the route's `max_call`.

The answer is judged strictly, because "not applied" releases the key: only
`true` or `false` at the pointer is a verdict. A JSON-RPC error, `isError`,
a missing `structuredContent` or anything else at the pointer leaves the
operation `unknown`, with evidence that says which. When applied, the
probe's result becomes the receipt, marked `_meta.idempotencyProbe` so that
a replay shows it came from the probe, not from the tool that was called.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from jsonpointer import EndOfList, JsonPointer

from gateway import __version__
from gateway.engine.errors import GatewayError
from gateway.engine.headers import header_value
from gateway.engine.models import StoredResponse
from gateway.engine.probes import Applied, NotApplied, NoVerdict, Verdict
from gateway.engine.recorded_request import redacted_arguments
from gateway.mcp.jsonrpc import JsonRpcError, RequestId, parse_message, parse_object
from gateway.mcp.replies import PROBE_META, dumps, strip_owned_meta
from gateway.mcp.sentences import PROBED_SENTENCE
from gateway.mcp.sessions import SESSION_HEADER
from gateway.mcp.sse import SseDecoder
from gateway.mcp.stdio_upstream import SCOPE_HEADER

if TYPE_CHECKING:
    from gateway.config import ProbeSettings, RouteSettings
    from gateway.engine.exchange import Upstream, UpstreamAnswer
    from gateway.engine.models import Operation

__all__ = [
    "CLIENT_INFO",
    "SESSION_PROTOCOL",
    "STATELESS_PROTOCOL",
    "McpProbe",
    "fill_arguments",
    "judge",
]

MISSING: Final = object()
"""What a pointer finds where the result has no value."""

SESSION_PROTOCOL = "2025-11-25"
STATELESS_PROTOCOL = "2026-07-28"
CLIENT_INFO = {"name": "idempotency-gateway-probe", "version": __version__}

_ENVELOPE = "io.modelcontextprotocol/"
"""The `_meta` prefix of a stateless request's reserved keys (version, client, capabilities)."""
_PROTOCOL_HEADER = "MCP-Protocol-Version"
_ACCEPT = "application/json, text/event-stream"
_INITIALIZE_ID = "probe-initialize"
_CALL_ID = "probe-call"
_EXCERPT = 200
"""The most characters of a server's own words kept in a piece of evidence."""

_PLACEHOLDER = re.compile(r"\{(forwarded_key|key|operation_id)\}")

JSON_HEADERS = (("Content-Type", "application/json"),)


class McpProbe:
    """The probe dialect of MCP routes (`gateway.engine.probes.ProbeDialect`)."""

    async def ask(
        self,
        upstream: Upstream,
        route: RouteSettings,
        probe: ProbeSettings,
        operation: Operation,
        forwarded: str,
    ) -> Verdict:
        tool, pointer = probe.tool, probe.applied_pointer
        assert tool is not None  # the config requires both on an MCP route
        assert pointer is not None
        arguments = fill_arguments(probe.arguments, operation, forwarded)
        # A stdio route's probe asks the child of the operation's scope.
        scope = () if route.command is None else ((SCOPE_HEADER, operation.scope),)
        session = _ProbeSession(upstream, route, probe, scope)
        try:
            async with asyncio.timeout(route.max_call):
                answer = await session.call(tool, arguments)
        except TimeoutError:
            return NoVerdict(
                "error",
                f"probe failed: {tool} gave no answer within the route's max_call "
                f"({route.max_call:g}s)",
            )
        except (GatewayError, _Unreadable) as exc:
            return NoVerdict("error", f"probe failed: {tool}: {exc.detail}")
        if answer.response is None:
            return NoVerdict(
                "inconclusive",
                f"probe {tool} was answered HTTP {answer.status} without a JSON-RPC response "
                f"to the call ({answer.how})",
                status=answer.status,
            )
        return judge(tool, pointer, answer.response, status=answer.status)

    def may_sample(self, operation: Operation) -> bool:
        """A call's receipt that is a result, not `isError` nor a JSON-RPC error: the
        effect surely happened, so a probe that can see must find it."""
        response = operation.response
        if response is None:
            return False
        try:
            document = parse_object(response.body)
        except JsonRpcError:
            return False
        result = document.get("result") if isinstance(document, dict) else None
        return isinstance(result, dict) and result.get("isError") is not True

    def request_of(
        self, route: RouteSettings, probe: ProbeSettings, operation: Operation, forwarded: str
    ) -> dict[str, Any]:
        arguments = fill_arguments(probe.arguments, operation, forwarded)
        return {
            "tool": probe.tool,
            "arguments": redacted_arguments(arguments, route.redact_request),
        }


def fill_arguments(arguments: Any, operation: Operation, forwarded: str) -> Any:
    """`arguments` with `{forwarded_key}`, `{key}` and `{operation_id}` replaced in every
    string, in one pass (a key holding `{key}` is not replaced again).

    >>> from types import SimpleNamespace as Op
    >>> fill_arguments({"ref": "{forwarded_key}", "tags": ["k={key}"], "n": 1},
    ...                Op(key="{key}", id="op_1"), "op_1")
    {'ref': 'op_1', 'tags': ['k={key}'], 'n': 1}
    """
    values = {"forwarded_key": forwarded, "key": operation.key, "operation_id": operation.id}
    if isinstance(arguments, str):
        return _PLACEHOLDER.sub(lambda match: values[match[1]], arguments)
    if isinstance(arguments, list):
        return [fill_arguments(item, operation, forwarded) for item in arguments]
    if isinstance(arguments, dict):
        return {
            name: fill_arguments(item, operation, forwarded) for name, item in arguments.items()
        }
    return arguments


def judge(tool: str, pointer: str, response: dict[str, Any], *, status: int | None) -> Verdict:
    """What the probe tool's JSON-RPC response says: `true` at `pointer` in its
    `structuredContent` is applied (the result becomes the receipt), `false` is not
    applied, and anything else is no verdict.

    >>> found = {"jsonrpc": "2.0", "id": 1, "result": {"structuredContent": {"found": False}}}
    >>> judge("find_ticket", "/found", found, status=200).said
    'find_ticket with /found = false'
    >>> judge("find_ticket", "/found", {"result": {"isError": True}}, status=200).evidence
    'probe find_ticket answered isError: true, neither applied nor not applied'
    """
    error = response.get("error")
    if error is not None:
        code = error.get("code") if isinstance(error, dict) else None
        message = error.get("message") if isinstance(error, dict) else None
        return NoVerdict(
            "inconclusive",
            f"probe {tool} answered JSON-RPC error {code}: {_excerpt(message)}",
            status=status,
        )
    result = response.get("result")
    if not isinstance(result, dict):
        return NoVerdict("inconclusive", f"probe {tool} answered no result object", status=status)
    if result.get("isError") is True:
        said = _text_of(result)
        return NoVerdict(
            "inconclusive",
            f"probe {tool} answered isError: true{f' ({said})' if said else ''}, "
            "neither applied nor not applied",
            status=status,
        )
    content = result.get("structuredContent")
    if not isinstance(content, dict | list):
        return NoVerdict(
            "inconclusive",
            f"probe {tool}'s result has no structuredContent to read {pointer} in",
            status=status,
        )
    value = JsonPointer(pointer).resolve(content, MISSING)
    if isinstance(value, EndOfList):  # "/-": the place after an array's end, never a value
        value = MISSING
    if value is True:
        return Applied(
            _receipt(tool, result), said=f"{tool} with {pointer} = true", status=status,
            result=content,
        )  # fmt: skip
    if value is False:
        return NotApplied(said=f"{tool} with {pointer} = false", status=status, result=content)
    if value is MISSING:
        return NoVerdict(
            "inconclusive",
            f"probe {tool}'s structuredContent has no value at {pointer}",
            status=status,
        )
    return NoVerdict(
        "inconclusive",
        f"probe {tool} answered {pointer} = {_excerpt(json.dumps(value))}, "
        "neither true (applied) nor false (not applied)",
        status=status,
    )


def _receipt(tool: str, result: dict[str, Any]) -> StoredResponse:
    """The receipt a probe makes: a tool result that says the call took effect, with the
    probe's own result (the gateway's `_meta` keys a server sent removed) in
    `_meta.idempotencyProbe`; a JSON-RPC response, each replay putting its own id in.

    It is not the called tool's result and must not pass for one: an SDK checks a
    result's `structuredContent` against the called tool's output schema, which the
    probe tool's answer does not follow, and raises. A result marked `isError` is
    not checked, and the sentence tells the model what is true."""
    cleaned = strip_owned_meta({"jsonrpc": "2.0", "id": None, "result": result})["result"]
    receipt = {
        "isError": True,
        "content": [{"type": "text", "text": PROBED_SENTENCE}],
        "_meta": {PROBE_META: {"tool": tool, "result": cleaned}},
    }
    body = dumps({"jsonrpc": "2.0", "id": None, "result": receipt})
    return StoredResponse(status=200, headers=JSON_HEADERS, body=body)


@dataclass(frozen=True, slots=True)
class _Answer:
    """The tool call's JSON-RPC response (None when the answer held none), the HTTP
    status it came with, and how it was asked (for the evidence)."""

    response: dict[str, Any] | None
    status: int
    how: str


class _Unreadable(Exception):
    """The server's answer could not be read as MCP (too large for the route)."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class _ProbeSession:
    """One probe's exchange with the server: a session of its own, or one stateless call."""

    def __init__(
        self,
        upstream: Upstream,
        route: RouteSettings,
        probe: ProbeSettings,
        extra: tuple[tuple[str, str], ...] = (),
    ) -> None:
        self._upstream = upstream
        self._route = route
        self._headers: tuple[tuple[str, str], ...] = (
            *extra,
            *probe.headers.items(),
            ("Content-Type", "application/json"),
            ("Accept", _ACCEPT),
        )

    async def call(self, tool: str, arguments: Any) -> _Answer:
        """Call `tool` on a session opened for this call, or, when the server refuses
        `initialize`, in one 2026-07-28 request."""
        refused, session = await self._initialize()
        if refused is not None:
            return await self._stateless(tool, arguments, refused)
        assert session is not None
        session_id, version = session
        headers = (
            *self._headers,
            (_PROTOCOL_HEADER, version),
            *(((SESSION_HEADER, session_id),) if session_id is not None else ()),
        )
        try:
            await self._notify(headers, {"jsonrpc": "2.0", "method": "notifications/initialized"})
            message = {
                "jsonrpc": "2.0",
                "id": _CALL_ID,
                "method": "tools/call",
                "params": {"name": tool, "arguments": arguments},
            }
            response, status = await self._post(headers, message, _CALL_ID)
            return _Answer(response, status, f"on a {version} session of the probe's own")
        finally:
            current = asyncio.current_task()
            if session_id is not None and not (current is not None and current.cancelling()):
                await self._end(headers)

    async def _initialize(self) -> tuple[str | None, tuple[str | None, str] | None]:
        """(None, (session id or None, negotiated version)), or (why it was refused, None)."""
        message = {
            "jsonrpc": "2.0",
            "id": _INITIALIZE_ID,
            "method": "initialize",
            "params": {
                "protocolVersion": SESSION_PROTOCOL,
                "capabilities": {},
                "clientInfo": CLIENT_INFO,
            },
        }
        reply = await self._upstream.send(
            self._route, "POST", self._route.upstream, self._headers, dumps(message)
        )
        try:
            response = await _response_in(reply, _INITIALIZE_ID, self._route.max_stored_response)
            status, session_id = reply.status, header_value(reply.headers, SESSION_HEADER)
        finally:
            reply.close()
        result = response.get("result") if response is not None else None
        if not 200 <= status < 300 or not isinstance(result, dict):
            error = response.get("error") if response is not None else None
            said = f"JSON-RPC error {error.get('code')}" if isinstance(error, dict) else "no result"
            return f"initialize was refused (HTTP {status}, {said})", None
        version = result.get("protocolVersion")
        return None, (session_id, version if isinstance(version, str) else SESSION_PROTOCOL)

    async def _stateless(self, tool: str, arguments: Any, refused: str) -> _Answer:
        headers = (
            *self._headers,
            (_PROTOCOL_HEADER, STATELESS_PROTOCOL),
            ("Mcp-Method", "tools/call"),
            ("Mcp-Name", tool),
        )
        message = {
            "jsonrpc": "2.0",
            "id": _CALL_ID,
            "method": "tools/call",
            "params": {
                "name": tool,
                "arguments": arguments,
                "_meta": {
                    _ENVELOPE + "protocolVersion": STATELESS_PROTOCOL,
                    _ENVELOPE + "clientInfo": CLIENT_INFO,
                    _ENVELOPE + "clientCapabilities": {},
                },
            },
        }
        response, status = await self._post(headers, message, _CALL_ID)
        return _Answer(response, status, f"in one {STATELESS_PROTOCOL} request: {refused}")

    async def _post(
        self, headers: tuple[tuple[str, str], ...], message: dict[str, Any], request_id: RequestId
    ) -> tuple[dict[str, Any] | None, int]:
        reply = await self._upstream.send(
            self._route, "POST", self._route.upstream, headers, dumps(message)
        )
        try:
            response = await _response_in(reply, request_id, self._route.max_stored_response)
        finally:
            reply.close()
        return response, reply.status

    async def _notify(self, headers: tuple[tuple[str, str], ...], message: dict[str, Any]) -> None:
        """Send a notification; its answer (202, or a refusal the call will meet too)
        is read and dropped."""
        reply = await self._upstream.send(
            self._route, "POST", self._route.upstream, headers, dumps(message)
        )
        try:
            await reply.read(self._route.max_stored_response)
        finally:
            reply.close()

    async def _end(self, headers: tuple[tuple[str, str], ...]) -> None:
        """DELETE the probe's session, best effort: the verdict does not depend on it,
        and a server that keeps it ends it at its own idle timeout."""
        ending = tuple((name, value) for name, value in headers if name != "Content-Type")
        try:
            reply = await self._upstream.send(
                self._route, "DELETE", self._route.upstream, ending, b""
            )
            try:
                await reply.read(self._route.max_stored_response)
            finally:
                reply.close()
        except GatewayError:
            pass


async def _response_in(
    reply: UpstreamAnswer, request_id: RequestId, limit: int
) -> dict[str, Any] | None:
    """The JSON-RPC response to `request_id` in a JSON or event-stream answer, read no
    further than it (a stream's other events, such as progress, are skipped)."""
    content_type = (header_value(reply.headers, "Content-Type") or "").split(";", 1)[0]
    if content_type.strip().lower() != "text/event-stream":
        body = await reply.read(limit)
        if body is None:
            raise _Unreadable("the answer was larger than max_stored_response")
        return _response_to(body, request_id)
    decoder, size = SseDecoder(), 0
    async for chunk in reply.rest():
        size += len(chunk)
        if size > limit:
            raise _Unreadable("the answer's stream grew larger than max_stored_response")
        for event in decoder.feed(chunk):
            if (response := _response_to(event.data.encode(), request_id)) is not None:
                return response
    return None


def _response_to(data: bytes, request_id: RequestId) -> dict[str, Any] | None:
    try:
        message = parse_message(data)
    except JsonRpcError:
        return None
    if message.kind != "response" or message.id != request_id:
        return None
    return message.document


def _text_of(result: dict[str, Any]) -> str:
    """The first text content of a result, shortened: what the server said went wrong."""
    for item in result.get("content") or ():
        if isinstance(item, dict) and item.get("type") == "text":
            return _excerpt(item.get("text"))
    return ""


def _excerpt(value: object) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= _EXCERPT else text[: _EXCERPT - 3] + "..."
