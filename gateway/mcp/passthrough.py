"""What passes an MCP route unrecorded, and the session ids that go with it.

Everything that is not a protected `tools/call` (initialize, discover,
lists, notifications, the GET server stream, DELETE) is forwarded as it came
and its answer streamed back as it arrives: an event reaches the client when
the server sends it, not when the stream ends.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web
from multidict import CIMultiDict

from gateway.engine.errors import UpstreamError
from gateway.mcp.hints import ToolListing
from gateway.mcp.jsonrpc import RequestId
from gateway.mcp.replies import dumps
from gateway.mcp.sessions import SESSION_HEADER
from gateway.proxy.view import cut_short, forward_headers
from gateway.web.appkeys import FORWARDER, MCP_HINTS, MCP_SESSIONS, METRICS, TRACE

if TYPE_CHECKING:
    from gateway.engine.scopes import CallerScope
    from gateway.proxy.routing import RouteMatch

JSON = "application/json"
EVENT_STREAM = "text/event-stream"


async def pass_through(
    request: web.Request,
    match: RouteMatch,
    caller: CallerScope,
    body: bytes,
    *,
    tools_listed_by: RequestId | None = None,
) -> web.StreamResponse:
    """Forward as it came and stream the answer back as it arrives; no record.

    The answer to a `tools/list` (`tools_listed_by` is its id) is also read as
    it passes, to learn which tools the server marks read-only.
    """
    app = request.app
    route = match.route
    request[TRACE].outcome = "passthrough"
    app[METRICS].passthrough.labels(route.name).inc()
    forwarder = app[FORWARDER]
    with forwarder.gate(route):
        answer = await forwarder.send(
            route, request.method, match.upstream_url, upstream_headers(request, caller), body
        )
    headers: CIMultiDict[str] = CIMultiDict(answer.headers)
    if caller.strips_authorization and (session := headers.get(SESSION_HEADER)) is not None:
        headers[SESSION_HEADER] = app[MCP_SESSIONS].tag(caller.scope, session)
    response = web.StreamResponse(status=answer.status, headers=headers)
    listing = None
    if tools_listed_by is not None:
        content_type = response.headers.get("Content-Type", "")
        listing = ToolListing(tools_listed_by, stream=content_type.startswith(EVENT_STREAM))
    try:
        await response.prepare(request)
        async for chunk in answer.rest():
            if listing is not None:
                listing.feed(chunk)
            await response.write(chunk)
        await response.write_eof()
    except ConnectionError:
        pass  # the caller left; nothing here is recorded
    except UpstreamError:
        cut_short(request)
    finally:
        answer.close()
    if listing is not None and (result := listing.result()) is not None:
        app[MCP_HINTS].learn(route.name, result)
    return response


def session_is_callers(request: web.Request, caller: CallerScope) -> bool:
    """With `[[clients]]`, a session id must carry the caller's own tag (see
    `gateway.mcp.sessions`); without, sessions are the server's business."""
    tagged = request.headers.get(SESSION_HEADER)
    if tagged is None or not caller.strips_authorization:
        return True
    return request.app[MCP_SESSIONS].untag(caller.scope, tagged) is not None


def upstream_headers(request: web.Request, caller: CallerScope) -> tuple[tuple[str, str], ...]:
    """The caller's headers as forwarded, the session id with its tag removed."""
    headers = forward_headers(request, caller)
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
