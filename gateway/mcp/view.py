"""The MCP front end's handler: Streamable HTTP in, the engine for protected tool calls.

A route with `kind = "mcp"` fronts one MCP server endpoint. Everything but a
protected `tools/call` passes through as the server sent it, streamed live
(initialize, discover, lists, notifications, the GET server stream, DELETE).
A protected call is claimed, sent with the forwarded key in
`params._meta.idempotencyKey`, and answered from the engine: live (progress
events as they come, then the response), replayed under the new `id`, or
refused as a tool result the model can read.

Nothing here answers problem+json: the SDKs would turn it into a bare
"Server returned an error response". Malformed messages get JSON-RPC errors
with the problem in `error.data`.
"""

from __future__ import annotations

import asyncio
import functools
import math
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web
from multidict import CIMultiDict

from gateway.engine.errors import (
    ClientNotAllowed,
    GatewayError,
    MissingKey,
    UpstreamCancelled,
)
from gateway.engine.exchange import ProxyRequest, Reply, UpstreamAnswer
from gateway.engine.headers import IDEMPOTENCY_KEY, IDEMPOTENCY_STATUS, IDEMPOTENT_REPLAYED
from gateway.engine.keys import format_key_header
from gateway.engine.models import State
from gateway.engine.recorded_request import mcp_record
from gateway.engine.scopes import settled_scope
from gateway.mcp.answers import EVENT_STREAM, McpCall
from gateway.mcp.calls import ToolCall, fingerprint_call
from gateway.mcp.jsonrpc import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    JsonRpcError,
    Message,
    RequestId,
    error_message,
)
from gateway.mcp.known_calls import call_name
from gateway.mcp.live_answer import LiveAnswer
from gateway.mcp.passthrough import (
    JSON,
    forward_unanswered,
    json_response,
    pass_through,
    session_is_callers,
    upstream_headers,
)
from gateway.mcp.reading import PostReading, ReadSpec
from gateway.mcp.replies import dumps, refusal_result
from gateway.mcp.sentences import SERVER_CANCELLED_SENTENCE
from gateway.mcp.sessions import SESSION_HEADER
from gateway.mcp.sse import encode_event
from gateway.mcp.status_view import is_status_call, list_tools_with_status, status_call
from gateway.mcp.versions import needs_result_type, protocol_version
from gateway.proxy.request_body import read_in_time
from gateway.proxy.view import (
    outcome_of,
    outcome_of_reply,
    read_body,
    start_detached,
)
from gateway.web.appkeys import (
    ENGINE,
    FORWARDER,
    MCP_CANCELLATIONS,
    MCP_DERIVED_KEYS,
    MCP_HINTS,
    MCP_KNOWN_CALLS,
    MCP_READER,
    METRICS,
    SCOPES,
    SETTINGS,
    STORE,
    TRACE,
)
from gateway.web.background import in_background
from gateway.web.caller import CallerLeft, until_caller_leaves
from gateway.web.caller_writes import respond
from gateway.web.problems import log_internal, problem_document

if TYPE_CHECKING:
    from gateway.config import RouteSettings
    from gateway.engine.scopes import CallerScope
    from gateway.proxy.routing import RouteMatch


async def serve_mcp(request: web.Request, match: RouteMatch) -> web.StreamResponse:
    """Answer one request on an MCP route; every refusal in JSON-RPC form."""
    app = request.app
    route = match.route
    trace = request[TRACE]
    message_id: RequestId | None = None
    try:
        caller = app[SCOPES].resolve(request.headers)
        trace.scope = caller.scope
        if route.clients is not None and caller.client not in route.clients:
            raise ClientNotAllowed(f"route {route.name!r} is not open to this client")
        if not session_is_callers(request, caller):
            return json_response(error_message(None, INVALID_REQUEST, "Session not found"), 404)
        body = await read_in_time(
            request, lambda: read_body(request, route.max_body), app[SETTINGS].server.client_timeout
        )
        if request.method != "POST":
            return await pass_through(request, match, caller, body)
        reading = await app[MCP_READER].read(body, _read_spec(request, route))
        message = reading.message
        message_id = message.id
        if message.method == "notifications/cancelled" and "requestId" in message.params:
            return _cancellation(request, match, caller, message, body)
        if message.kind != "request":
            return await pass_through(request, match, caller, body)
        name = call_name_of(request, caller, message.id)
        if message.method == "tools/call" and not is_status_call(request, route, message):
            return await _tool_call(request, match, caller, reading, body, name)
        # Known before it is sent on, so that a cancellation of it is forwarded at once.
        with app[MCP_KNOWN_CALLS].handling(name, protected=False):
            if message.method == "tools/call":
                return await status_call(request, route, caller, reading)
            if message.method == "tools/list" and route.status_tool:
                return await list_tools_with_status(request, match, caller, message, body)
            listed = message.id if message.method == "tools/list" else None
            return await pass_through(request, match, caller, body, tools_listed_by=listed)
    except JsonRpcError as exc:
        trace.outcome = "rejected"
        return json_response(
            error_message(message_id, exc.code, exc.message, exc.data or None), 400
        )
    except GatewayError as error:
        trace.outcome = "rejected"
        request_id = log_internal(request, error)
        problem = problem_document(error, instance=request.path, request_id=request_id)
        code = INVALID_PARAMS if error.status == 400 else INVALID_REQUEST
        return json_response(error_message(message_id, code, error.detail, problem), error.status)


async def _tool_call(
    request: web.Request,
    match: RouteMatch,
    caller: CallerScope,
    reading: PostReading,
    body: bytes,
    name: str,
) -> web.StreamResponse:
    app = request.app
    route = match.route
    trace = request[TRACE]
    known = app[MCP_KNOWN_CALLS]
    if reading.call_error is not None:
        raise reading.call_error
    call = reading.call
    assert call is not None
    key, retention = call.key, None
    if key is None:
        if not _needs_a_key(app, route, call):
            with known.handling(name, protected=False):
                return await pass_through(request, match, caller, body, tool_call=True)
        if route.derive_key != "arguments":
            raise MissingKey(
                f"tool {call.name!r} on route {route.name!r} needs an idempotency key: "
                "send params._meta.idempotencyKey"
            )
        retention = route.derived_key_retention
        caller, key = await app[MCP_DERIVED_KEYS].settled(
            caller, route.name, call, retention, app[STORE].get
        )
    else:
        caller = await settled_scope(caller, key, app[STORE].get)
    trace.key = key
    trace.scope = caller.scope
    live = (
        LiveAnswer(request, write_timeout=app[SETTINGS].server.write_timeout)
        if _accepts(request, EVENT_STREAM)
        else None
    )
    plain = fingerprint_call(route.name, call)
    try:
        proxy_request = ProxyRequest(
            route=route,
            upstream_url=match.upstream_url,
            method="tools/call",
            path=call.name,
            headers=(),
            body=body,
            scope=caller.scope,
            key=key,
            fingerprint=app[ENGINE].digests.fingerprint(caller.scope, plain),
            plain_fingerprints=(plain,),
            # A duplicate in flight waits for the outcome rather than being refused at once.
            wait_seconds=route.timeout,
            trace=trace,
            dialect=McpCall(
                route,
                call,
                reading.forward_body,
                on_event=live.send if live else None,
                resume=_resumer(request, match, caller),
            ),
            retention=retention,
            forward_operation_id=retention is not None,
            distinct=call.distinct,
            derived=retention is not None,
            record=functools.partial(
                mcp_record,
                tool=call.name,
                arguments=call.arguments,
                size=len(body),
                limit=route.record_request_max,
                redact=route.redact_request,
            ),
        )
        engine, metrics = app[ENGINE], app[METRICS]
        try:
            # Known as protected before it is sent (and while a replay or a refusal is
            # answered): its cancellation, on whichever worker, is never forwarded.
            ref = (caller.scope, key, proxy_request.fingerprint)
            with known.handling(name, protected=True, ref=ref):
                reply = engine.answer_from_receipt(proxy_request)
                if reply is None:
                    headers = upstream_headers(request, caller, route)
                    call_task = start_detached(app, proxy_request._replace(headers=headers))
                    reply = await _unless_closed(request, call_task, ref)
                    if reply is None:
                        return web.Response(status=204)  # nobody is left to read it
        except GatewayError as error:
            trace.outcome, trace.state = outcome_of(error), error.state
            trace.refused(error)
            metrics.request(route.name, trace.outcome)
            request_id = log_internal(request, error)
            problem = problem_document(
                error.concerning(key), instance=request.path, request_id=request_id
            )
            refused = _key_headers(key, error.state, replayed=False)
            if error.retry_after is not None:
                # The hint goes both ways: in the result for the model's code, and as the
                # header an HTTP-level client honours.
                problem["retry_after"] = max(1, math.ceil(error.retry_after))
                refused["Retry-After"] = str(problem["retry_after"])
            refusal = refusal_result(
                call.id,
                problem,
                protocol_version(request.headers),
                status_tool=route.status_tool,
                # The call the server cancelled is this caller's own, not an earlier one.
                sentence=(
                    SERVER_CANCELLED_SENTENCE if isinstance(error, UpstreamCancelled) else None
                ),
            )
            return await _answer(request, live, refusal, refused)
        trace.outcome = outcome_of_reply(reply)
        trace.state = reply.state.value if reply.state is not None else None
        metrics.request(route.name, trace.outcome)
        return await _answer_reply(request, live, call, key, reply)
    finally:
        if live is not None:
            live.close()  # a writer still waiting for events it will never get


async def _unless_closed(
    request: web.Request, call: asyncio.Task[Reply], ref: tuple[str, str, str]
) -> Reply | None:
    """The protected call's reply; None when a 2026-07-28 caller closed its request first
    (its way to cancel): the call runs on detached, cancelled at nothing, and its history
    records the held-back cancellation."""
    if not needs_result_type(protocol_version(request.headers)):
        return await asyncio.shield(call)
    try:
        return await until_caller_leaves(request, asyncio.shield(call))
    except CallerLeft:
        in_background(request.app, request.app[ENGINE].cancellation_held(*ref))
        return None


def _read_spec(request: web.Request, route: RouteSettings) -> ReadSpec:
    """What reading a POST on this route depends on besides its body."""
    return ReadSpec(
        route=route.name,
        header_keys=tuple(request.headers.getall(IDEMPOTENCY_KEY, [])),
        mcp_method=request.headers.get("Mcp-Method"),
        mcp_name=request.headers.get("Mcp-Name"),
        status_tool=route.status_tool,
    )


def call_name_of(request: web.Request, caller: CallerScope, request_id: object) -> str:
    """The name a request and its cancellation share: the caller's scope, the session
    id as the caller sent it (none without one) and the request id."""
    return call_name(caller.scope, request.headers.get(SESSION_HEADER), request_id)


def _cancellation(
    request: web.Request, match: RouteMatch, caller: CallerScope, message: Message, body: bytes
) -> web.Response:
    """A client's `notifications/cancelled`, answered 202 at once: dropped when it names
    a protected call, else forwarded once the request it names is known, or after the
    route's `cancel_hold` (see `gateway.mcp.cancellations`)."""
    app, route = request.app, match.route
    name = call_name_of(request, caller, message.params["requestId"])
    cancellations = app[MCP_CANCELLATIONS]
    if not cancellations.dropped_at_once(name, route=route.name):
        headers = upstream_headers(request, caller, route)

        async def forward() -> None:
            await forward_unanswered(app, match, caller.scope, headers, body)

        cancellations.decide(
            name, hold=route.cancel_hold, forward=forward, route=route.name, scope=caller.scope
        )
    return web.Response(status=202)


def _resumer(
    request: web.Request, match: RouteMatch, caller: CallerScope
) -> Callable[[str], Awaitable[UpstreamAnswer]]:
    """How to reopen a protected call's stream after an event id: a GET on the same
    endpoint, with the caller's (forwarded) headers and `Last-Event-ID`."""
    replaced = {"accept", "last-event-id", "content-type", "content-length"}

    async def resume(last_id: str) -> UpstreamAnswer:
        # Built here, not for every call: few calls are ever resumed.
        headers = [
            (name, value)
            for name, value in upstream_headers(request, caller, match.route)
            if name.lower() not in replaced
        ]
        sent = (*headers, ("Accept", EVENT_STREAM), ("Last-Event-ID", last_id))
        forwarder = request.app[FORWARDER]
        return await forwarder.send(match.route, "GET", match.upstream_url, sent, b"")

    return resume


def _needs_a_key(app: web.Application, route: RouteSettings, call: ToolCall) -> bool:
    """Whether a call that came without a key must get one (or a derived one)."""
    if not route.require_key and route.derive_key is False:
        return False
    if call.name in route.skip_tools:
        return False
    if "*" not in route.protect_tools and call.name not in route.protect_tools:
        return False
    return not (route.trust_read_only_hint and app[MCP_HINTS].read_only(route.name, call.name))


async def _answer_reply(
    request: web.Request, live: LiveAnswer | None, call: ToolCall, key: str, reply: Reply
) -> web.StreamResponse:
    headers = _key_headers(key, reply.state.value if reply.state else None, reply.replayed)
    if reply.replayed:
        version = protocol_version(request.headers)
        replay = await request.app[MCP_READER].replay(reply.body, call.id, version)
        return await _answer(request, live, replay, headers)
    if reply.state is State.RELEASED:
        # The call has not run (unknown session, a refusal, input required): the
        # server's answer as it came, after any events already streamed.
        if live is not None and live.started:
            event = encode_event(reply.body.decode("utf-8", "replace"), event="message")
            return await live.finish(event, headers)
        passed: CIMultiDict[str] = CIMultiDict(reply.headers)
        passed.update(headers)
        return web.Response(status=reply.status, headers=passed, body=reply.body)
    return await _answer(request, live, reply.body, headers)


async def _answer(
    request: web.Request,
    live: LiveAnswer | None,
    message: dict[str, Any] | bytes,
    headers: dict[str, str],
) -> web.StreamResponse:
    """The final JSON-RPC message: the last event of a live stream already started,
    else JSON when the caller takes it, else a one-event stream. A fresh answer
    comes as the receipt's bytes (its id is the request's): sent as they are."""
    body = message if isinstance(message, bytes) else dumps(message)
    if live is not None and (live.started or not _accepts(request, JSON)):
        return await live.finish(encode_event(body.decode(), event="message"), headers)
    return await respond(request, 200, CIMultiDict({**headers, "Content-Type": JSON}), body)


def _accepts(request: web.Request, media_type: str) -> bool:
    accept = request.headers.get("Accept", "")
    return media_type in accept or "*/*" in accept or not accept


def _key_headers(key: str, state: str | None, replayed: bool) -> dict[str, str]:
    headers = {IDEMPOTENCY_KEY: format_key_header(key)}
    if state is not None:
        headers[IDEMPOTENCY_STATUS] = state
    if replayed:
        headers[IDEMPOTENT_REPLAYED] = "true"
    return headers
