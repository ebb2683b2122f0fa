"""What passes an MCP route unrecorded, and the session ids that go with it.

Everything that is not a protected `tools/call` (initialize, discover,
lists, notifications, the GET server stream, DELETE) is forwarded as it came
and its answer streamed back as it arrives: an event reaches the client when
the server sends it, not when the stream ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

from aiohttp import web
from multidict import CIMultiDict

from gateway.config import RouteSettings
from gateway.engine.errors import GatewayError, UpstreamError
from gateway.engine.fairness import Lane
from gateway.mcp.answers import EVENT_STREAM
from gateway.mcp.hints import ToolListing
from gateway.mcp.jsonrpc import JsonRpcError, RequestId, parse_object
from gateway.mcp.replies import dumps, strip_owned_meta
from gateway.mcp.sessions import SESSION_HEADER
from gateway.mcp.sse import SseDecoder, encode_event
from gateway.mcp.stdio_upstream import SCOPE_HEADER
from gateway.proxy.view import cut_short, forward_headers
from gateway.web.appkeys import FORWARDER, MCP_HINTS, MCP_SESSIONS, METRICS, QUOTAS, TRACE
from gateway.web.caller import CallerLeft, until_caller_leaves

if TYPE_CHECKING:
    from gateway.engine.scopes import CallerScope
    from gateway.proxy.routing import RouteMatch

JSON = "application/json"

log = logging.getLogger("gateway.mcp")


async def pass_through(
    request: web.Request,
    match: RouteMatch,
    caller: CallerScope,
    body: bytes,
    *,
    tools_listed_by: RequestId | None = None,
    tool_call: bool = False,
) -> web.StreamResponse:
    """Forward as it came and stream the answer back as it arrives; no record.

    The answer to a `tools/list` (`tools_listed_by` is its id) is also read as
    it passes, to learn which tools the server marks read-only. The answer to
    an unprotected `tool_call` loses any `_meta` key the gateway owns: a server
    must not make a live answer look like a replay.
    """
    app = request.app
    route = match.route
    request[TRACE].outcome = "passthrough"
    app[METRICS].passthrough.labels(route.name).inc()
    forwarder = app[FORWARDER]
    # A GET is the server's stream: it lives as long as the session, so it counts
    # against the scope's streams, never its calls (`gateway.engine.fairness`).
    lane = Lane.STREAMS if request.method == "GET" else Lane.CALLS
    with (
        app[QUOTAS].in_flight(caller.scope, lane),
        forwarder.gate(route, caller.scope, lane),
    ):
        answer = await forwarder.send(
            route,
            request.method,
            match.upstream_url,
            upstream_headers(request, caller, route),
            body,
            # A server's GET stream is silent while the server has nothing to say:
            # `timeout` bounds calls, `max_stream` (below) this.
            may_idle=request.method == "GET",
        )
        headers: CIMultiDict[str] = CIMultiDict(answer.headers)
        if caller.strips_authorization and (session := headers.get(SESSION_HEADER)) is not None:
            headers[SESSION_HEADER] = app[MCP_SESSIONS].tag(caller.scope, session)
        stream = headers.get("Content-Type", "").startswith(EVENT_STREAM)
        guard = OwnedMetaFilter(stream=stream) if tool_call else None
        if guard is not None:
            headers.popall("Content-Length", None)
        response = web.StreamResponse(status=answer.status, headers=headers)
        listing = (
            ToolListing(tools_listed_by, stream=stream) if tools_listed_by is not None else None
        )

        async def relay() -> None:
            async with asyncio.timeout(route.max_stream):
                await response.prepare(request)
                async for chunk in answer.rest():
                    if listing is not None:
                        listing.feed(chunk)
                    await response.write(guard.feed(chunk) if guard is not None else chunk)
                if guard is not None:
                    await response.write(guard.finish())
                await response.write_eof()

        try:
            # A caller that closes its request (how a 2026-07-28 client cancels) closes
            # the gateway's to the server too, as going direct would: nothing here is
            # recorded, so nothing is lost by stopping.
            await until_caller_leaves(request, relay())
        except TimeoutError:
            await _end_at_max_stream(request, response, route.name, route.max_stream)
        except (ConnectionError, CallerLeft):
            pass  # the caller left; nothing here is recorded
        except UpstreamError:
            cut_short(request)
        finally:
            answer.close()
    if listing is not None and (result := listing.result()) is not None:
        app[MCP_HINTS].learn(route.name, result)
    return response


async def _end_at_max_stream(
    request: web.Request, response: web.StreamResponse, route: str, max_stream: float
) -> None:
    """End an answer that outlived the route's `max_stream`, the way a server ends a
    stream: the client opens a new one (with `Last-Event-ID`), and the slot it held
    goes back, so no stream holds one for ever however lively it keeps it."""
    log.info(
        "an answer passed through reached the route's max_stream (%gs) and was ended",
        max_stream,
        extra={"event": "mcp_stream_ended", "route": route},
    )
    if not response.prepared:
        cut_short(request)
        return
    with contextlib.suppress(ConnectionError):
        await response.write_eof()


async def forward_unanswered(
    app: web.Application,
    match: RouteMatch,
    scope: str,
    headers: tuple[tuple[str, str], ...],
    body: bytes,
) -> None:
    """Forward a notification whose caller was answered already (a cancellation decided
    in the background); the server's answer is read and dropped. A failure is logged:
    nobody is left to tell. It takes a slot of the caller's share like any call."""
    route = match.route
    app[METRICS].passthrough.labels(route.name).inc()
    forwarder = app[FORWARDER]
    try:
        with forwarder.gate(route, scope):
            answer = await forwarder.send(route, "POST", match.upstream_url, headers, body)
            try:
                async for _ in answer.rest():
                    pass
            finally:
                answer.close()
    except GatewayError as error:
        log.info(
            "a notification was not forwarded: %s",
            error.detail,
            extra={"event": "mcp_notification_unsent", "route": route.name},
        )


class OwnedMetaFilter:
    """Drops `_meta.idempotencyReplayed` and `_meta.idempotency` from the messages of
    an answer as it passes (event by event, or the JSON body once whole)."""

    def __init__(self, *, stream: bool) -> None:
        self._decoder = SseDecoder() if stream else None
        self._body = bytearray()

    def feed(self, chunk: bytes) -> bytes:
        if self._decoder is None:
            self._body += chunk
            return b""
        return b"".join(
            encode_event(_clean(event.data), event=event.event, event_id=event.id)
            for event in self._decoder.feed(chunk)
        )

    def finish(self) -> bytes:
        if self._decoder is not None:
            return b""
        return _clean(bytes(self._body).decode("utf-8", "replace")).encode()


def _clean(data: str) -> str:
    try:
        document = parse_object(data)
    except JsonRpcError:
        return data
    if not isinstance(document, dict):
        return data
    cleaned = strip_owned_meta(document)
    return data if cleaned == document else dumps(cleaned).decode()


def session_is_callers(request: web.Request, caller: CallerScope) -> bool:
    """With `[[clients]]`, a session id must carry the caller's own tag (see
    `gateway.mcp.sessions`); without, sessions are the server's business."""
    tagged = request.headers.get(SESSION_HEADER)
    if tagged is None or not caller.strips_authorization:
        return True
    return request.app[MCP_SESSIONS].untag(caller.scope, tagged) is not None


def upstream_headers(
    request: web.Request, caller: CallerScope, route: RouteSettings
) -> tuple[tuple[str, str], ...]:
    """The caller's headers as forwarded, the session id with its tag removed; to a stdio
    route's children also the caller's scope, which picks the scope's child (the header
    never leaves the process)."""
    headers = forward_headers(request, caller)
    if route.command is not None:
        headers = (*headers, (SCOPE_HEADER, caller.scope))
    tagged = request.headers.get(SESSION_HEADER)
    if tagged is None or not caller.strips_authorization:
        return headers
    session = request.app[MCP_SESSIONS].untag(caller.scope, tagged) or ""
    return tuple(
        (name, session if name.lower() == SESSION_HEADER.lower() else value)
        for name, value in headers
    )


def json_response(
    document: dict[str, Any], status: int, headers: dict[str, str] | None = None
) -> web.Response:
    return web.Response(
        status=status, body=dumps(document), content_type=JSON, headers=headers or {}
    )
