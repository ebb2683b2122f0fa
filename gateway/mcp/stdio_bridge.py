"""A stdio MCP route's server, as the rest of the gateway sees it: a Streamable HTTP
endpoint on loopback, one per route and worker, in front of that worker's children.

An MCP route with `command` instead of `upstream` gets every guarantee of an HTTP MCP
route by being one: at startup the route's `upstream` becomes this endpoint (a port
the OS chose on 127.0.0.1, and a secret header only this process knows), so claims,
receipts, probes by tool, the status tool and the similar guard run unchanged. Here
each POST is relayed to a child (`StdioChild`), one per caller scope unless the route
says `shared_tenants = true`, at most `max_children` of them (the idlest one stops to
make room). The children speak the session-based generation; a caller in 2026-07-28
gets its results with `resultType`. A child that exits fails its calls in flight (the
connection is dropped, so each is `unknown`) and the next call starts a new one, after
a backoff that doubles while children keep dying.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Final

from aiohttp import web

from gateway.config import RouteSettings, Settings
from gateway.mcp.stdio_child import ChildGone, StdioChild, child_environment
from gateway.mcp.versions import complete_result, needs_result_type, protocol_version

__all__ = ["BRIDGE_HEADER", "SCOPE_HEADER", "StdioBridge", "bind_stdio_routes"]

log = logging.getLogger("gateway.mcp.stdio")

BRIDGE_HEADER: Final = "X-Idempotency-Gateway-Bridge"
"""The secret that proves a request to a bridge came from its own gateway process."""
SCOPE_HEADER: Final = "X-Idempotency-Gateway-Scope"
"""The caller's scope, on requests to a bridge only: it picks the scope's child."""
SHARED: Final = ""
"""The one child's scope key on a `shared_tenants` route."""

BACKOFF_FIRST: Final = 0.5
BACKOFF_MAX: Final = 30.0


@dataclass
class _Slot:
    """A scope's child, and how soon another may start after the last one died."""

    child: StdioChild | None = None
    starting: asyncio.Lock = field(default_factory=asyncio.Lock)
    failures: int = 0
    backoff: float = 0.0
    not_before: float = 0.0
    started_at: float = 0.0
    used: float = 0.0

    def died(self, now: float) -> None:
        """The next child starts at once after one death, then waits `BACKOFF_FIRST`,
        doubling up to `BACKOFF_MAX` while children keep dying within that long of their
        start; one that lived longer begins the count again."""
        if now - self.started_at > BACKOFF_MAX:
            self.failures = 0
        self.failures += 1
        self.backoff = (
            0.0
            if self.failures == 1
            else min(BACKOFF_FIRST * 2 ** (self.failures - 2), BACKOFF_MAX)
        )
        self.not_before = now + self.backoff
        self.child = None


class NotSent(Exception):
    """No child can take the call now: nothing reached a server (429, Retry-After)."""

    def __init__(self, detail: str, retry_after: float) -> None:
        super().__init__(detail)
        self.retry_after = retry_after


class StdioBridge:
    """The loopback endpoint of one stdio route in one worker, and its children."""

    def __init__(self, route: RouteSettings, sock: socket.socket, secret: str) -> None:
        assert route.command is not None
        self.route = route
        self._sock = sock
        self._secret = secret
        self._slots: dict[str, _Slot] = {}
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        host, port = self._sock.getsockname()[:2]
        return f"http://{host}:{port}"

    def children(self) -> dict[str, StdioChild]:
        """The running children by scope key (tests and metrics read it)."""
        return {
            scope: slot.child
            for scope, slot in self._slots.items()
            if slot.child is not None and not slot.child.exited.is_set()
        }

    async def start(self) -> None:
        app = web.Application(client_max_size=self.route.max_body + (1 << 16))
        app.router.add_post("/", self._post)
        app.router.add_route("*", "/", self._not_offered)
        # A request the gateway abandons (its caller's passed-through call closed, a silence
        # past `timeout`) cancels its handler, and so the call at the child, as a closed
        # request would at a server reached directly.
        self._runner = web.AppRunner(
            app, access_log=None, handle_signals=False, handler_cancellation=True
        )
        await self._runner.setup()
        await web.SockSite(self._runner, self._sock).start()

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        await asyncio.gather(
            *(slot.child.stop() for slot in self._slots.values() if slot.child is not None),
            return_exceptions=True,
        )

    # -- HTTP ------------------------------------------------------------------------

    async def _not_offered(self, request: web.Request) -> web.Response:
        # No server stream (GET) and no session to end (DELETE): the spec's 405.
        return web.Response(status=405, headers={"Allow": "POST"})

    async def _post(self, request: web.Request) -> web.StreamResponse:
        if not secrets.compare_digest(request.headers.get(BRIDGE_HEADER, ""), self._secret):
            return web.Response(status=403, text="not this gateway's request")
        try:
            message = json.loads(await request.read())
        except ValueError:
            return _jsonrpc(None, error={"code": -32700, "message": "Parse error"})
        if not isinstance(message, dict) or not isinstance(message.get("method"), str):
            return web.Response(status=202)  # a client's answer: nothing asked it
        scope = SHARED if self.route.shared_tenants else request.headers.get(SCOPE_HEADER, "")
        try:
            child = await self._child(scope)
        except NotSent as exc:
            # 429 releases the key (the route's release_statuses hold it): nothing was sent.
            return _jsonrpc(
                message.get("id"),
                error={"code": -32603, "message": str(exc)},
                status=429,
                headers={"Retry-After": str(max(1, round(exc.retry_after)))},
            )
        if "id" not in message:
            await self._notification(child, message)
            return web.Response(status=202)
        return await self._request(request, child, message)

    async def _request(
        self, request: web.Request, child: StdioChild, message: dict[str, Any]
    ) -> web.StreamResponse:
        method = message["method"]
        if method == "initialize":
            return _jsonrpc(message["id"], result=dict(child.initialize_result))
        if method == "server/discover":
            # The children speak the session-based generation: a client falls back to it.
            return _jsonrpc(message["id"], error={"code": -32601, "message": "Method not found"})
        try:
            answer = await child.call(_for_a_session(message))
        except ChildGone:
            # The call may have been applied: no answer at all, so the gateway cannot
            # mistake it for one, and the protected call is `unknown`.
            assert request.transport is not None
            request.transport.close()
            raise web.HTTPServiceUnavailable() from None
        result = answer.get("result")
        if isinstance(result, dict):
            answer["result"] = _for_the_caller(method, result, protocol_version(request.headers))
        return _jsonrpc(message["id"], **answer)

    async def _notification(self, child: StdioChild, message: dict[str, Any]) -> None:
        if message["method"] == "notifications/initialized":
            return  # the gateway initialized the child itself, once
        # A cancellation names the caller's id, which the child never saw; the caller's
        # closed request is what cancels a call at the child (`StdioChild.call`).
        if message["method"] == "notifications/cancelled":
            return
        with contextlib.suppress(ChildGone):
            await child.notify(message)

    # -- children --------------------------------------------------------------------

    async def _child(self, scope: str) -> StdioChild:
        """The scope's running child, started now if there is none; `NotSent` while the
        last one's backoff runs, when it cannot start, or when no room can be made."""
        slot = self._slots.get(scope)
        if slot is None:
            await self._make_room()
            slot = self._slots.setdefault(scope, _Slot())
        loop = asyncio.get_running_loop()
        slot.used = loop.time()
        async with slot.starting:
            if slot.child is not None and not slot.child.exited.is_set():
                return slot.child
            if slot.child is not None:
                slot.died(loop.time())
            wait = slot.not_before - loop.time()
            if wait > 0:
                raise NotSent(
                    f"the stdio server of route {self.route.name!r} exited; it is restarted "
                    f"in {wait:.1f} s (backoff)",
                    wait,
                )
            child = StdioChild(
                self.route.command or (),
                child_environment(self.route.env),
                label=self.route.name,
                run_as=self.route.run_as,
            )
            slot.started_at = loop.time()
            try:
                await child.start()
            except ChildGone as exc:
                slot.died(loop.time())
                raise NotSent(
                    f"{exc}; it is tried again in {slot.backoff:.1f} s", slot.backoff
                ) from exc
            slot.child = child
            return child

    async def _make_room(self) -> None:
        """Past `max_children`, stop the least recently used child with no call in flight."""
        running = [(scope, slot) for scope, slot in self._slots.items() if slot.child is not None]
        if len(running) < self.route.max_children:
            return
        idle = [(slot.used, scope) for scope, slot in running if slot.child.in_flight == 0]  # type: ignore[union-attr]
        if not idle:
            raise NotSent(
                f"all {self.route.max_children} stdio servers of the route (max_children) are "
                "busy with calls; try again shortly",
                1.0,
            )
        _, scope = min(idle)
        slot = self._slots.pop(scope)
        assert slot.child is not None
        await slot.child.stop()


_ENVELOPE_KEYS: Final = frozenset(
    f"io.modelcontextprotocol/{name}"
    for name in ("protocolVersion", "clientInfo", "clientCapabilities", "logLevel")
)
"""What a 2026-07-28 request carries in `params._meta` instead of a session: the child
has the gateway's session, and a session-based server refuses a request that has them."""


def _for_a_session(message: dict[str, Any]) -> dict[str, Any]:
    """The request without its id (the child numbers its own) and without the per-request
    envelope of the stateless generation."""
    sent = {name: value for name, value in message.items() if name != "id"}
    params = sent.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    if isinstance(params, dict) and isinstance(meta, dict) and _ENVELOPE_KEYS & meta.keys():
        kept = {name: value for name, value in meta.items() if name not in _ENVELOPE_KEYS}
        sent["params"] = (
            {**params, "_meta": kept}
            if kept
            else {name: value for name, value in params.items() if name != "_meta"}
        )
    return sent


_CACHEABLE: Final = frozenset(
    ("prompts/list", "resources/list", "resources/read", "resources/templates/list", "tools/list")
)
"""Methods whose results must say how long they may be cached, from 2026-07-28."""


def _for_the_caller(method: str, result: dict[str, Any], version: str | None) -> dict[str, Any]:
    """A session-based child's result as a 2026-07-28 caller must get it: `resultType`,
    and on a list or a read the most cautious caching (none, private), as the SDKs give a
    server that says nothing."""
    result = complete_result(result, version)
    if needs_result_type(version) and method in _CACHEABLE:
        result.setdefault("ttlMs", 0)
        result.setdefault("cacheScope", "private")
    return result


def _jsonrpc(
    id_: Any, *, status: int = 200, headers: dict[str, str] | None = None, **fields: Any
) -> web.Response:
    body = {"jsonrpc": "2.0", "id": id_, **fields}
    return web.Response(
        status=status, body=json.dumps(body), content_type="application/json", headers=headers
    )


def bind_stdio_routes(settings: Settings) -> tuple[Settings, list[StdioBridge]]:
    """Give each `command` route a bridge on a loopback port bound now (the route table
    is built from these settings before anything serves), and point its `upstream`
    there, with the bridge's secret among its upstream headers."""
    bridges: list[StdioBridge] = []
    routes = []
    for route in settings.routes:
        if route.command is None:
            routes.append(route)
            continue
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        secret = secrets.token_urlsafe(32)
        bridge = StdioBridge(route, sock, secret)
        bound = route.model_copy(
            update={
                "upstream": bridge.url,
                "upstream_headers": {**route.upstream_headers, BRIDGE_HEADER: secret},
                # The bridge's "nothing was sent" (`NotSent`): the key is released.
                "release_statuses": tuple(dict.fromkeys((*route.release_statuses, 429))),
            }
        )
        bridge.route = bound
        bridges.append(bridge)
        routes.append(bound)
    if not bridges:
        return settings, []
    return settings.model_copy(update={"routes": tuple(routes)}), bridges


@contextlib.asynccontextmanager
async def running(bridges: list[StdioBridge]) -> AsyncIterator[None]:
    """The bridges serving for as long as the gateway does; their children stopped after."""
    started: list[StdioBridge] = []
    try:
        for bridge in bridges:
            await bridge.start()
            started.append(bridge)
        yield
    finally:
        await asyncio.gather(*(bridge.close() for bridge in started), return_exceptions=True)
