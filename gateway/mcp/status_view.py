"""The status tool on the wire: added to `tools/list` answers, answered from the store.

`gateway.mcp.status_tool` says what the tool is and answers; this module
puts it into a server's tool listing (read whole, since it is changed:
listings are small and bounded) and serves calls to it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web
from multidict import CIMultiDict

from gateway.mcp.answers import EVENT_STREAM
from gateway.mcp.hints import MAX_LISTING_BYTES
from gateway.mcp.jsonrpc import JsonRpcError, Message, parse_object
from gateway.mcp.passthrough import json_response, upstream_headers
from gateway.mcp.replies import dumps
from gateway.mcp.sse import SseDecoder, encode_event
from gateway.mcp.status_tool import definition, status_result
from gateway.mcp.versions import complete_result, protocol_version
from gateway.web.appkeys import ENGINE, FORWARDER, MCP_HINTS, QUOTAS, SETTINGS, TRACE

if TYPE_CHECKING:
    from gateway.config import RouteSettings
    from gateway.engine.scopes import CallerScope
    from gateway.mcp.reading import PostReading
    from gateway.proxy.routing import RouteMatch


def is_status_call(request: web.Request, route: RouteSettings, message: Message) -> bool:
    name = message.params.get("name")
    return (
        route.status_tool is not None
        and name == route.status_tool
        and not request.app[MCP_HINTS].listed(route.name, name)
    )


async def status_call(
    request: web.Request, route: RouteSettings, caller: CallerScope, reading: PostReading
) -> web.Response:
    """The status tool, answered from the store in the caller's scope; never forwarded."""
    if reading.status_error is not None:
        raise reading.status_error
    question = reading.status_question
    assert question is not None
    engine = request.app[ENGINE]
    if question.key is not None:
        operation = await engine.lookup(caller.scope, question.key)
    else:
        # By the call itself: the latest operation of it, under whatever key it was made.
        # Stored keyed, or plain by a gateway of before keyed fingerprints: both are looked up.
        plain = question.fingerprint
        assert plain is not None
        forms = (engine.digests.fingerprint(caller.scope, plain), plain)
        operation = await engine.find_request(caller.scope, route.name, forms)
    request[TRACE].outcome = "status"
    idempotency = request.app[SETTINGS].idempotency
    remembered = idempotency.tombstone_retention
    if route.derive_key:
        remembered = min(remembered, route.derived_key_retention)
    answer = status_result(question, operation, remembered=remembered)
    result = complete_result(answer, protocol_version(request.headers))
    return json_response({"jsonrpc": "2.0", "id": reading.message.id, "result": result}, 200)


async def list_tools_with_status(
    request: web.Request,
    match: RouteMatch,
    caller: CallerScope,
    message: Message,
    body: bytes,
) -> web.StreamResponse:
    """A `tools/list` answer with the status tool added (unless the server lists one of
    that name). Read whole, since it is changed: listings are small and bounded."""
    app = request.app
    route = match.route
    assert route.status_tool is not None
    forwarder = app[FORWARDER]
    with app[QUOTAS].in_flight(caller.scope), forwarder.gate(route, caller.scope):
        answer = await forwarder.send(
            route,
            request.method,
            match.upstream_url,
            upstream_headers(request, caller, route),
            body,
        )
        try:
            raw = await answer.read(MAX_LISTING_BYTES)
        finally:
            answer.close()
    headers: CIMultiDict[str] = CIMultiDict(answer.headers)
    if raw is None or not 200 <= answer.status < 300:
        return web.Response(status=answer.status, headers=headers, body=raw or b"")
    stream = headers.get("Content-Type", "").startswith(EVENT_STREAM)
    if stream:
        messages = [event.data for event in SseDecoder().feed(raw + b"\n\n")]
    else:
        messages = [raw.decode("utf-8", "replace")]
    first_page = "cursor" not in message.params
    rewritten = [
        _with_status_tool(app, route, message.id, data, add=first_page) for data in messages
    ]
    if stream:
        out = b"".join(encode_event(data, event="message") for data in rewritten)
    else:
        out = rewritten[0].encode()
    headers.popall("Content-Length", None)
    return web.Response(status=answer.status, headers=headers, body=out)


def _with_status_tool(
    app: web.Application, route: RouteSettings, request_id: object, data: str, *, add: bool
) -> str:
    """One message of a `tools/list` answer; the listing itself learned from and, on
    the first page, given the status tool."""
    try:
        document = parse_object(data)
    except JsonRpcError:
        return data
    if not isinstance(document, dict) or document.get("id") != request_id:
        return data
    result = document.get("result")
    if not isinstance(result, dict) or not isinstance(result.get("tools"), list):
        return data
    app[MCP_HINTS].learn(route.name, result)
    names = {tool.get("name") for tool in result["tools"] if isinstance(tool, dict)}
    assert route.status_tool is not None
    if not add or route.status_tool in names:
        return data
    result["tools"].append(definition(route.status_tool))
    return dumps(document).decode()
