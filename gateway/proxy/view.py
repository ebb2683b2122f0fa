"""The catch-all handler: translate an HTTP request into a call on the engine and back.

It parses (route, scope, key, body), fingerprints, and hands the request to
`IdempotencyEngine`; it decides nothing about keys itself. The engine call
runs in its own task, shielded from the handler: a client that disconnects
cancels nothing, the upstream call runs to its end and its receipt is
recorded, ready for the retry. A retry of a completed key is answered
straight from the store's committed record (`answer_from_receipt`), with no
task at all.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
from ipaddress import IPv4Network, IPv6Address, IPv6Network, ip_address

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError
from multidict import CIMultiDict

from gateway.config import GATEWAY_PATHS, RouteSettings
from gateway.engine.errors import (
    ClientNotAllowed,
    GatewayError,
    InProgress,
    InvalidRequest,
    KeyMismatch,
    MethodNotAllowed,
    MissingKey,
    NotFound,
    OutcomeUnknown,
    SimilarOperation,
    UnsupportedTransferCoding,
    UpstreamConnectionLost,
    UpstreamError,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from gateway.engine.exchange import ProxyRequest, Reply
from gateway.engine.fingerprint import fingerprints
from gateway.engine.headers import (
    IDEMPOTENCY_KEY,
    IDEMPOTENCY_RECEIPT_SOURCE,
    IDEMPOTENCY_SIMILAR,
    IDEMPOTENCY_STATUS,
    IDEMPOTENT_REPLAYED,
    Pairs,
)
from gateway.engine.keys import format_key_header, parse_idempotency_key
from gateway.engine.markers import IDEMPOTENCY_DISTINCT, parse_distinct
from gateway.engine.recorded_request import http_record
from gateway.engine.scopes import CallerScope, settled_scope
from gateway.proxy.request_body import read_in_time, read_limited
from gateway.proxy.routing import RouteMatch
from gateway.upstream.headers import end_to_end, forwarded, forwarded_for
from gateway.web.appkeys import (
    ENGINE,
    FORWARDER,
    METRICS,
    OFFLOADER,
    QUOTAS,
    ROUTES,
    SCOPES,
    SETTINGS,
    STORE,
    TRACE,
)
from gateway.web.background import in_background
from gateway.web.caller_writes import respond, stream_to_caller

log = logging.getLogger("gateway.proxy")

_NOT_FORWARDED = frozenset(
    {
        "host",
        "idempotency-key",
        "idempotency-distinct",
        "x-forwarded-for",
        "forwarded",
        "x-forwarded-host",
        "x-forwarded-proto",
    }
)
"""Replaced by the gateway: `Host` names the upstream, the key is forwarded per route,
the distinct marker is the gateway's own, the forwarding headers say what it saw
(`forwarding_headers`)."""


_ALLOWED_ON_OWN_PATHS = {"/operations": "GET, POST", "/admin": "GET, POST"}
"""Methods of the gateway's own paths (`GATEWAY_PATHS`); the others answer GET and HEAD."""


def _refuse_own_path(path: str, method: str) -> None:
    """A method the gateway's own endpoints do not serve gets 405, not `no-route`.

    No route may overlap these paths (the config refuses it), so nothing is lost.
    """
    for prefix in GATEWAY_PATHS:
        if path == prefix or path.startswith(prefix + "/"):
            allowed = _ALLOWED_ON_OWN_PATHS.get(prefix, "GET, HEAD")
            if method in allowed.split(", ") or (method == "HEAD" and "GET" in allowed):
                # A method these paths serve, on a path that is none of them.
                raise NotFound(f"nothing at {path}")
            raise MethodNotAllowed(f"{method} is not allowed on {path}", allow=allowed)


NOT_PROTECTED = "not-protected"
"""`Idempotency-Status` of an answer to a keyed request on a method the route does not protect."""


def match_route(request: web.Request) -> RouteMatch:
    """The route a proxied request belongs to (`no-route` and 405 on own paths raise)."""
    url = request.rel_url
    if "#" in request.raw_path:
        # The parsed URL drops a fragment: the checks would not see what follows `#`.
        raise InvalidRequest("the request target may not contain '#': a fragment is never sent")
    _refuse_own_path(request.path, request.method)
    match = request.app[ROUTES].match(url.raw_path, url.raw_query_string)
    request[TRACE].route = match.route.name
    return match


async def serve_http(request: web.Request, match: RouteMatch) -> web.StreamResponse:
    """Answer a request on a plain HTTP route."""
    app = request.app
    url = request.rel_url
    trace = request[TRACE]
    route = match.route
    caller = app[SCOPES].resolve(request.headers)
    trace.scope = caller.scope
    if route.clients is not None and caller.client not in route.clients:
        raise ClientNotAllowed(f"route {route.name!r} is not open to this client")
    protected = request.method in route.methods
    key = parse_idempotency_key(request.headers.getall(IDEMPOTENCY_KEY, [])) if protected else None
    trace.key = key
    if key is not None:
        caller = await settled_scope(caller, key, app[STORE].get)
        trace.scope = caller.scope
    distinct = key is not None and parse_distinct(request.headers.getall(IDEMPOTENCY_DISTINCT, []))
    if protected and key is None and route.require_key:
        raise MissingKey(
            f"{request.method} on route {route.name!r} requires an Idempotency-Key header"
        )
    try:
        body = await read_in_time(
            request, lambda: read_body(request, route.max_body), app[SETTINGS].server.client_timeout
        )
    except GatewayError as error:
        error.concerning(key)
        raise
    engine = app[ENGINE]
    metrics = app[METRICS]

    if key is None:
        # A key on a method the route does not protect: passed through, but never silently.
        unprotected_key = not protected and IDEMPOTENCY_KEY in request.headers
        trace.outcome = NOT_PROTECTED if unprotected_key else "passthrough"
        metrics.passthrough.labels(route.name).inc()
        headers = forward_headers(request, caller)
        passed = await _pass_through(app, route, caller.scope, request.method, match, headers, body)
        if unprotected_key:
            passed = dataclasses.replace(
                passed, headers=(*passed.headers, (IDEMPOTENCY_STATUS, NOT_PROTECTED))
            )
        return await write_reply(request, passed)

    plain, plain_legacy = await app[OFFLOADER].run(
        len(body),
        fingerprints,
        request.method,
        route.name,
        url.raw_path,
        url.raw_query_string,
        request.headers.get("Content-Type"),
        body,
        app[SETTINGS].testing.canonical_json,
    )
    proxy_request = ProxyRequest(
        route=route,
        upstream_url=match.upstream_url,
        method=request.method,
        path=url.raw_path,
        headers=(),  # only a request that goes upstream needs them: see below
        body=body,
        scope=caller.scope,
        key=key,
        fingerprint=engine.digests.fingerprint(caller.scope, plain),
        legacy_fingerprint=(
            None if plain_legacy is None else engine.digests.fingerprint(caller.scope, plain_legacy)
        ),
        plain_fingerprints=(plain,) if plain_legacy is None else (plain, plain_legacy),
        wait_seconds=_preferred_wait(
            request.headers.getall("Prefer", []), app[SETTINGS].idempotency.max_wait
        ),
        trace=trace,
        record=functools.partial(
            http_record,
            method=request.method,
            target=url.raw_path + ("?" + url.raw_query_string if url.raw_query_string else ""),
            content_type=request.headers.get("Content-Type"),
            body=body,
            limit=route.record_request_max,
            redact=route.redact_request,
            digest=functools.partial(engine.digests.body, caller.scope),
            record_raw=route.record_raw,
        ),
        distinct=distinct,
    )
    try:
        reply = engine.answer_from_receipt(proxy_request)
        if reply is None:
            headers = forward_headers(request, caller)
            reply = await execute_detached(app, proxy_request._replace(headers=headers))
    except GatewayError as error:
        trace.outcome, trace.state = outcome_of(error), error.state
        trace.refused(error)
        metrics.request(route.name, trace.outcome)
        error.concerning(key)
        raise
    trace.outcome = outcome_of_reply(reply)
    trace.state = reply.state.value if reply.state is not None else None
    metrics.request(route.name, trace.outcome)
    return await write_reply(request, reply)


def start_detached(app: web.Application, proxy_request: ProxyRequest) -> asyncio.Task[Reply]:
    """The engine's work on the request in a task of its own: a caller that goes away
    cancels nothing."""
    return in_background(app, app[ENGINE].execute(proxy_request))


async def execute_detached(app: web.Application, proxy_request: ProxyRequest) -> Reply:
    """`start_detached`, and its reply."""
    return await asyncio.shield(start_detached(app, proxy_request))


async def write_reply(request: web.Request, reply: Reply) -> web.StreamResponse:
    """Send a reply as received or as stored, plus the key headers.

    A caller that stops reading is cut after `write_timeout` (`gateway.web.caller_writes`):
    the reply's outcome is recorded already, or (a spooled answer) is being read
    and recorded by a task of its own, whatever happens here."""
    headers: CIMultiDict[str] = CIMultiDict(reply.headers)
    if reply.key is not None:
        headers[IDEMPOTENCY_KEY] = format_key_header(reply.key)
        if reply.state is not None:
            headers[IDEMPOTENCY_STATUS] = reply.state.value
    if reply.replayed:
        headers[IDEMPOTENT_REPLAYED] = "true"
    if reply.receipt_source is not None:
        headers[IDEMPOTENCY_RECEIPT_SOURCE] = reply.receipt_source
    if reply.similar is not None:
        headers[IDEMPOTENCY_SIMILAR] = reply.similar
    if reply.stream is None:
        return await respond(request, reply.status, headers, reply.body)
    response = web.StreamResponse(status=reply.status, headers=headers)
    try:
        await stream_to_caller(request, response, reply.stream)
    except ConnectionError:
        pass  # the caller left or was cut; the outcome never waited for it
    except UpstreamError:
        cut_short(request)
    finally:
        if reply.close is not None:
            reply.close()
    return response


def cut_short(request: web.Request) -> None:
    """The upstream's body broke off after the status line went out with the first bytes:
    no problem response can follow. The caller sees the body end early, as the upstream's
    did, and its lookup says the rest (the engine recorded the key `unknown`)."""
    if request.transport is not None:
        request.transport.close()


async def _pass_through(
    app: web.Application,
    route: RouteSettings,
    scope: str,
    method: str,
    match: RouteMatch,
    headers: Pairs,
    body: bytes,
) -> Reply:
    """An unprotected request: no record, the same one-send forwarder, and the same count
    of the scope's requests and slot of the route as a protected one, held until the
    last byte of the answer is passed on (`gateway.engine.fairness`)."""
    forwarder = app[FORWARDER]
    with app[QUOTAS].in_flight(scope) as counted, forwarder.gate(route, scope) as slot:
        reply = await forwarder.send(route, method, match.upstream_url, headers, body)
        try:
            received = await reply.read(route.max_stored_response)
        except BaseException:
            reply.close()
            raise
        passed = Reply.from_upstream(reply, received)
        if passed.stream is not None:
            passed = passed.holding(counted.keep(), slot.keep())
    return passed


def _preferred_wait(values: list[str], cap: float) -> float:
    """Seconds from RFC 7240 `Prefer: wait=N`, capped by `max_wait`; 0 when absent."""
    for value in values:
        for preference in value.split(","):
            name, _, argument = preference.split(";", 1)[0].strip().partition("=")
            if name.strip().lower() == "wait":
                try:
                    seconds = float(argument.strip().strip('"'))
                except ValueError:
                    continue
                if seconds > 0:
                    return min(seconds, cap)
    return 0.0


async def read_body(request: web.Request, limit: int) -> bytes:
    codings = [
        coding.strip().lower()
        for value in request.headers.getall("Transfer-Encoding", [])
        for coding in value.split(",")
        if coding.strip()
    ]
    if any(coding != "chunked" for coding in codings):
        raise UnsupportedTransferCoding(
            f"Transfer-Encoding {', '.join(codings)!r}: only chunked is supported"
        )
    try:
        return await read_limited(request, limit)
    except (ConnectionResetError, RequestPayloadError, HttpProcessingError) as exc:
        raise InvalidRequest(f"the request body could not be read: {exc}") from exc


def forward_headers(request: web.Request, caller: CallerScope) -> Pairs:
    """The caller's end-to-end headers as the upstream gets them, values as the bytes
    received (`as_sent`), plus the forwarding headers the gateway vouches for; a caller's
    own client-address headers only from a trusted proxy (`CLIENT_ADDRESS_HEADERS`)."""
    drop = _NOT_FORWARDED | {"authorization"} if caller.strips_authorization else _NOT_FORWARDED
    if not _from_trusted_proxy(request.remote, request.app[SETTINGS].server.trusted_proxies):
        drop = drop | CLIENT_ADDRESS_HEADERS
    pairs = end_to_end(
        ((name.decode("latin-1"), as_sent(value)) for name, value in request.raw_headers),
        drop=drop,
    )
    return (*pairs, *forwarding_headers(request))


CLIENT_ADDRESS_HEADERS = frozenset(
    {"x-real-ip", "true-client-ip", "x-forwarded-port", "x-original-url", "x-rewrite-url"}
)
"""Headers by which a proxy tells the upstream who called, or which URL was asked: from
anyone but a trusted proxy they are a caller's claim about itself, and are dropped (an
upstream that trusts `X-Real-IP: 10.0.0.1` would take the caller for an internal one)."""


def as_sent(value: bytes) -> str:
    """A header value as the string the upstream client writes back as the same bytes: the
    client encodes values as UTF-8, so a UTF-8 value goes as it came (`café` stays
    `café`, where a latin-1 reading sent `cafÃ©`). A value that is not UTF-8 cannot be
    written back as received: it is read as latin-1 (each byte above 0x7F then goes as
    two), as `docs/contract.md` says."""
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return value.decode("latin-1")


def forwarding_headers(request: web.Request) -> Pairs:
    """`X-Forwarded-For`, `Forwarded`, `X-Forwarded-Host` and `X-Forwarded-Proto` for the
    upstream: a trusted proxy's (`[server] trusted_proxies`) passed on with this hop
    appended; anyone else's replaced with what the gateway saw. A caller's own
    `X-Forwarded-For: 10.0.0.1` would otherwise pass for an internal address upstream
    (security review, finding 8)."""
    client_ip = request.remote
    trusted = _from_trusted_proxy(client_ip, request.app[SETTINGS].server.trusted_proxies)
    headers = request.headers if trusted else _NO_HEADERS
    host = headers.get("X-Forwarded-Host", request.host)
    return (
        ("X-Forwarded-For", forwarded_for(headers.get("X-Forwarded-For"), client_ip) or ""),
        (
            "Forwarded",
            forwarded(headers.get("Forwarded"), client_ip, request.host, request.scheme),
        ),
        ("X-Forwarded-Host", host),
        ("X-Forwarded-Proto", headers.get("X-Forwarded-Proto", request.scheme)),
    )


_NO_HEADERS: CIMultiDict[str] = CIMultiDict()


def _from_trusted_proxy(
    address: str | None, proxies: tuple[IPv4Network | IPv6Network, ...]
) -> bool:
    if not proxies or not address:
        return False
    try:
        ip = ip_address(address)
    except ValueError:
        return False
    if isinstance(ip, IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return any(ip in network for network in proxies)


def outcome_of_reply(reply: Reply) -> str:
    if reply.replayed:
        return "replayed"
    if reply.state is not None and reply.state.value == "released":
        return "released"
    return "forwarded"


def outcome_of(error: GatewayError) -> str:
    if isinstance(error, KeyMismatch):
        return "mismatch"
    if isinstance(error, InProgress):
        return "in_progress"
    if isinstance(error, SimilarOperation):
        return "similar"
    if isinstance(error, OutcomeUnknown | UpstreamTimeout | UpstreamConnectionLost):
        return "unknown"
    if isinstance(error, UpstreamUnreachable):
        return "released"
    return "rejected"
