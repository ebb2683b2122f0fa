"""A stdio MCP route's upstream, in the gateway's own process: what the forwarder sends a
stdio route's requests to instead of an HTTP server.

An MCP route with `command` instead of `upstream` gets every guarantee of an HTTP MCP
route by being one to the rest of the gateway: the forwarder hands its requests here
(the same method, headers and JSON-RPC body it would POST), and gets back an answer
of the same shape (a status, headers, a body), so claims, receipts, probes by tool,
the status tool and the similar guard run unchanged. No port and no loopback hop: the
request goes from the caller's handler to the child's stdin.

Each request goes to a child (`StdioChild`), one per caller scope unless the route
says `shared_tenants = true`, at most `max_children` of them per worker (the idlest
one stops to make room). The children speak the session-based generation; a caller
in 2026-07-28 gets its results with what that generation requires. A child that
exits fails its calls in flight (`UpstreamConnectionLost`: sent, no answer, so each
is `unknown`); the next request starts a new one, at once after one death, then after
a backoff that doubles while children keep dying. A request no child can take is
`UpstreamUnreachable` (nothing was sent: the key is released).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from gateway.config import RouteSettings
from gateway.engine.errors import UpstreamConnectionLost, UpstreamTimeout, UpstreamUnreachable
from gateway.engine.headers import Pairs, header_value
from gateway.mcp.stdio_child import ChildGone, StdioChild, child_environment
from gateway.mcp.versions import (
    PROTOCOL_VERSION_HEADER,
    complete_result,
    needs_result_type,
    protocol_version,
)

__all__ = ["SCOPE_HEADER", "StdioUpstream", "stdio_upstreams"]

log = logging.getLogger("gateway.mcp.stdio")

SCOPE_HEADER: Final = "X-Idempotency-Gateway-Scope"
"""The caller's scope, on a stdio route's requests only (never leaves the process): it
picks the scope's child."""
SHARED: Final = ""
"""The one child's scope key on a `shared_tenants` route."""

BACKOFF_FIRST: Final = 0.5
BACKOFF_MAX: Final = 30.0

_JSON: Final[Pairs] = (("Content-Type", "application/json"),)

_ENVELOPE_KEYS: Final = frozenset(
    f"io.modelcontextprotocol/{name}"
    for name in ("protocolVersion", "clientInfo", "clientCapabilities", "logLevel")
)
"""What a 2026-07-28 request carries in `params._meta` instead of a session: the child
has the gateway's session, and a session-based server refuses a request that has them."""

_CACHEABLE: Final = frozenset(
    ("prompts/list", "resources/list", "resources/read", "resources/templates/list", "tools/list")
)
"""Methods whose results must say how long they may be cached, from 2026-07-28."""


class StdioAnswer:
    """A child's answer in the shape of an HTTP one (`gateway.engine.exchange.UpstreamAnswer`):
    the whole body is here already."""

    def __init__(self, status: int, body: bytes = b"", headers: Pairs = _JSON) -> None:
        self.status = status
        self.headers = headers if body else ()
        self._body = body

    async def read(self, limit: int) -> bytes | None:
        return self._body if len(self._body) <= limit else None

    async def rest(self) -> AsyncIterator[bytes]:
        if self._body:
            yield self._body

    def close(self) -> None:
        self._body = b""


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


class StdioUpstream:
    """One stdio route's children in this worker, and the exchange of a request with them."""

    def __init__(self, route: RouteSettings) -> None:
        assert route.command is not None
        self.route = route
        self._slots: dict[str, _Slot] = {}

    async def close(self) -> None:
        await asyncio.gather(
            *(slot.child.stop() for slot in self._slots.values() if slot.child is not None),
            return_exceptions=True,
        )

    async def exchange(
        self, method: str, headers: Sequence[tuple[str, str]], body: bytes
    ) -> StdioAnswer:
        """What an MCP server over Streamable HTTP would answer this request with.

        Raises `UpstreamUnreachable` when no child could take it (nothing was sent),
        `UpstreamConnectionLost` when its child exited before answering, and
        `UpstreamTimeout` after the route's `timeout` without a word from the child."""
        if method != "POST":
            # No server stream (GET) and no session to end (DELETE): the spec's 405.
            return StdioAnswer(405, headers=(("Allow", "POST"),))
        try:
            message = json.loads(body)
        except ValueError:
            return _jsonrpc(400, None, error={"code": -32700, "message": "Parse error"})
        if not isinstance(message, dict) or not isinstance(message.get("method"), str):
            return StdioAnswer(202)  # a client's answer: nothing asked it
        scope = SHARED if self.route.shared_tenants else header_value(headers, SCOPE_HEADER) or ""
        child = await self._child(scope)
        if "id" not in message:
            await self._notification(child, message)
            return StdioAnswer(202)
        said = header_value(headers, PROTOCOL_VERSION_HEADER)
        version = None if said is None else protocol_version({PROTOCOL_VERSION_HEADER: said})
        return await self._request(child, message, version)

    async def _request(
        self, child: StdioChild, message: dict[str, Any], version: str | None
    ) -> StdioAnswer:
        method = message["method"]
        if method == "initialize":
            return _jsonrpc(200, message["id"], result=dict(child.initialize_result))
        if method == "server/discover":
            # The children speak the session-based generation: a client falls back to it.
            return _jsonrpc(
                200, message["id"], error={"code": -32601, "message": "Method not found"}
            )
        try:
            answer = await child.call(_for_a_session(message), silence=self.route.timeout)
        except ChildGone as exc:
            raise UpstreamConnectionLost(
                f"the stdio server of route {self.route.name!r} exited before answering",
                internal=str(exc),
            ) from None
        except TimeoutError:
            raise UpstreamTimeout(
                f"the stdio server of route {self.route.name!r} said nothing for "
                f"{self.route.timeout:g}s (the route's timeout)"
            ) from None
        result = answer.get("result")
        if isinstance(result, dict):
            answer["result"] = _for_the_caller(method, result, version)
        return _jsonrpc(200, message["id"], **answer)

    async def _notification(self, child: StdioChild, message: dict[str, Any]) -> None:
        # `initialized`: the gateway initialized the child itself, once. A cancellation
        # names the caller's id, which the child never saw; a call the gateway abandons
        # is what cancels at the child (`StdioChild.call`).
        if message["method"] in ("notifications/initialized", "notifications/cancelled"):
            return
        try:
            await child.notify(message)
        except ChildGone:
            log.info(
                "a notification for a stdio server that exited was dropped",
                extra={"event": "stdio-notification-dropped", "route": self.route.name},
            )

    # -- children --------------------------------------------------------------------

    async def _child(self, scope: str) -> StdioChild:
        """The scope's running child, started now if there is none; `UpstreamUnreachable`
        while the last one's backoff runs, when it cannot start, or when no room can be
        made for it."""
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
                raise self._not_sent(f"it exited; it is restarted in {wait:.1f} s (backoff)")
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
                raise self._not_sent(f"{exc}; it is tried again in {slot.backoff:.1f} s") from exc
            slot.child = child
            return child

    async def _make_room(self) -> None:
        """Past `max_children`, stop the least recently used child with no call in flight."""
        running = [(scope, slot) for scope, slot in self._slots.items() if slot.child is not None]
        if len(running) < self.route.max_children:
            return
        idle = [
            (slot.used, scope)
            for scope, slot in running
            if slot.child is not None and slot.child.in_flight == 0
        ]
        if not idle:
            raise self._not_sent(
                f"all {self.route.max_children} of its stdio servers (max_children) are busy "
                "with calls; try again shortly"
            )
        _, scope = min(idle)
        slot = self._slots.pop(scope)
        assert slot.child is not None
        await slot.child.stop()

    def _not_sent(self, why: str) -> UpstreamUnreachable:
        return UpstreamUnreachable(
            f"the stdio server of route {self.route.name!r} cannot take the call: {why}; "
            "nothing was sent"
        )


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


def _for_the_caller(method: str, result: dict[str, Any], version: str | None) -> dict[str, Any]:
    """A session-based child's result as a 2026-07-28 caller must get it: `resultType`,
    and on a list or a read the most cautious caching (none, private), as the SDKs give a
    server that says nothing."""
    result = complete_result(result, version)
    if needs_result_type(version) and method in _CACHEABLE:
        result.setdefault("ttlMs", 0)
        result.setdefault("cacheScope", "private")
    return result


def _jsonrpc(status: int, id_: Any, **fields: Any) -> StdioAnswer:
    body = json.dumps({"jsonrpc": "2.0", "id": id_, **fields}, ensure_ascii=False)
    return StdioAnswer(status, body.encode())


def stdio_upstreams(routes: Sequence[RouteSettings]) -> Mapping[str, StdioUpstream]:
    """The stdio routes' upstreams of this worker, by route name."""
    return {route.name: StdioUpstream(route) for route in routes if route.command is not None}
