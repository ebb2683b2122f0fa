"""No tenant starves another: a route's slots, each scope's share, streams apart.

The security review's finding 1: with `max_concurrency = 8`, one tenant
holding 8 slow pass-through requests, or 8 MCP server streams, made every
other tenant's protected call fail (`route-saturated`, or "could not connect
to the upstream": streams and answers still being read held pooled
connections the route's gate no longer counted). The unit tests pin
`gateway.engine.fairness` and the scope-wide limits; the others run a real
gateway in front of real upstreams on loopback, with two `[[clients]]`.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import logging
from collections.abc import AsyncIterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web
from conftest import GatewayFactory
from harness import RunningGateway
from upstream import CountingUpstream, serve_mcp_handlers

from gateway.config import QuotaSettings
from gateway.engine.errors import QuotaExceeded, RouteSaturated
from gateway.engine.fairness import (
    MAX_TRACKED_SCOPES,
    USE_WINDOW_SECONDS,
    Hold,
    Lane,
    RouteSlots,
    fair_share,
)
from gateway.engine.quotas import ScopeQuotas

PROBLEM = "application/problem+json"
MCP_HEADERS = {
    "Accept": "application/json, text/event-stream",
    "MCP-Protocol-Version": "2025-11-25",
}
STREAM_HEADERS = {"Accept": "text/event-stream", "MCP-Protocol-Version": "2025-11-25"}


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


CLIENTS = [
    {"name": "noisy", "token_sha256": [_sha256("tok-noisy")]},
    {"name": "quiet", "token_sha256": [_sha256("tok-quiet")]},
]
NOISY = {"Authorization": "Bearer tok-noisy"}
QUIET = {"Authorization": "Bearer tok-quiet"}


def kind(document: dict[str, Any]) -> str:
    return str(document["type"]).rsplit("/", 1)[-1]


# -- the slots themselves ---------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_share_is_half_rounded_up() -> None:
    """A scope's share is half the slots, rounded up, and never none."""
    assert [fair_share(n) for n in (1, 2, 3, 8, 9, 256)] == [1, 1, 2, 4, 5, 128]


def test_a_scope_alone_may_use_every_slot() -> None:
    """Alone on a route, a scope takes every slot; the next is route-saturated."""
    slots = RouteSlots("tickets", 4)
    with ExitStack() as held:
        for _ in range(4):
            held.enter_context(slots.hold("alice"))
        with pytest.raises(RouteSaturated):
            slots.hold("alice")
    assert slots.active(Lane.CALLS) == 0


def test_while_two_scopes_use_a_route_neither_takes_more_than_half() -> None:
    """With another scope using the route, a scope past its share is refused quota-exceeded
    and the other keeps the rest; a third scope then finds the route full."""
    slots = RouteSlots("tickets", 8)
    with ExitStack() as held:
        held.enter_context(slots.hold("bob"))
        for _ in range(4):
            held.enter_context(slots.hold("alice"))
        with pytest.raises(QuotaExceeded, match="its share of the route's 8"):
            slots.hold("alice")
        for _ in range(3):
            held.enter_context(slots.hold("bob"))
        with pytest.raises(QuotaExceeded):
            slots.hold("bob")
        with pytest.raises(RouteSaturated):
            slots.hold("carol")


def test_a_refused_newcomer_turns_the_share_on() -> None:
    """A scope that filled the route alone is refused once a newcomer asked, and the
    newcomer gets the next slot given back."""
    slots = RouteSlots("tickets", 4)
    alice = [slots.hold("alice") for _ in range(4)]
    with pytest.raises(RouteSaturated):
        slots.hold("bob")
    alice.pop().__exit__(None, None, None)
    with pytest.raises(QuotaExceeded):
        slots.hold("alice")
    with slots.hold("bob"):
        assert slots.active(Lane.CALLS) == 4
    for hold in alice:
        hold.__exit__(None, None, None)


def test_on_a_route_of_two_clients_the_share_holds_from_the_first_request() -> None:
    """Where two or more [[clients]] may use the route, the first to come is held to its
    share alone, so the slots another will need are there when it comes."""
    slots = RouteSlots("tickets", 4, tenants=True)
    with slots.hold("client:noisy"), slots.hold("client:noisy"):
        with pytest.raises(QuotaExceeded):
            slots.hold("client:noisy")
        with slots.hold("client:quiet"), slots.hold("client:quiet"):
            assert slots.active(Lane.CALLS) == 4


def test_the_share_ends_when_the_other_scope_stops_using_the_route() -> None:
    """A scope that neither holds a slot nor asked within the window no longer limits
    the others."""
    clock = FakeClock()
    slots = RouteSlots("tickets", 2, clock=clock)
    with slots.hold("bob"):
        pass
    with slots.hold("alice"), pytest.raises(QuotaExceeded):
        slots.hold("alice")
    clock.now += USE_WINDOW_SECONDS
    with slots.hold("alice"), slots.hold("alice"):
        assert slots.active(Lane.CALLS) == 2


def test_a_scope_holding_a_stream_uses_the_route_however_long_ago_it_asked() -> None:
    """A stream opened long ago still makes its scope a user of the route."""
    clock = FakeClock()
    slots = RouteSlots("tools", 2, clock=clock)
    with slots.hold("bob", Lane.STREAMS):
        clock.now += 10 * USE_WINDOW_SECONDS
        with slots.hold("alice"), pytest.raises(QuotaExceeded):
            slots.hold("alice")


def test_streams_never_take_a_calls_slot() -> None:
    """The streams lane full, calls still get every slot of theirs."""
    slots = RouteSlots("tools", 2)
    with slots.hold("alice", Lane.STREAMS), slots.hold("alice", Lane.STREAMS):
        with pytest.raises(RouteSaturated, match="server streams"):
            slots.hold("alice", Lane.STREAMS)
        with slots.hold("alice"), slots.hold("alice"):
            assert (slots.active(Lane.CALLS), slots.active(Lane.STREAMS)) == (2, 2)


def test_an_answer_streamed_past_its_block_keeps_its_slot() -> None:
    """A slot handed to a stream (`keep`) is given back when the stream closes, once."""
    slots = RouteSlots("tickets", 1)
    with slots.hold("alice") as slot:
        close = slot.keep()
    with pytest.raises(RouteSaturated):
        slots.hold("alice")
    close()
    close()
    assert slots.active(Lane.CALLS) == 0
    with slots.hold("alice"):
        assert slots.active(Lane.CALLS) == 1


def test_hold_gives_back_once() -> None:
    """A hold's release runs once, when its block and all its keepers are done."""
    released: list[int] = []
    hold = Hold(lambda: released.append(1))
    first, second = hold.keep(), hold.keep()
    with hold:
        first()
    assert released == []
    second()
    assert released == [1]


def test_the_scopes_a_route_remembers_are_bounded() -> None:
    """However many scopes ask, a route remembers at most MAX_TRACKED_SCOPES of them."""
    slots = RouteSlots("tickets", 1)
    for n in range(MAX_TRACKED_SCOPES + 50):
        with slots.hold(f"s{n}"):
            pass
    assert len(slots._seen) == MAX_TRACKED_SCOPES


def test_scope_limits_are_divided_among_workers() -> None:
    """max_in_flight and max_streams are gateway-wide: each of N workers allows its part."""
    quotas = ScopeQuotas(QuotaSettings(max_in_flight=4, max_streams=3), workers=2)
    with quotas.in_flight("alice"), quotas.in_flight("alice"):
        with pytest.raises(QuotaExceeded, match="2 requests in flight"):
            quotas.in_flight("alice")
        with quotas.in_flight("bob"):
            pass
    with quotas.in_flight("alice", Lane.STREAMS), quotas.in_flight("alice", Lane.STREAMS):
        with pytest.raises(QuotaExceeded, match="2 server streams open"):
            quotas.in_flight("alice", Lane.STREAMS)
        with quotas.in_flight("alice"):  # calls and streams are counted apart
            pass


def test_max_streams_is_on_by_default_and_max_in_flight_is_not() -> None:
    """Without [quotas], a scope's streams are capped (16) and its calls only by the share."""
    quotas = ScopeQuotas(QuotaSettings())
    with ExitStack() as held:
        for _ in range(100):
            held.enter_context(quotas.in_flight("alice"))
        for _ in range(16):
            held.enter_context(quotas.in_flight("alice", Lane.STREAMS))
        with pytest.raises(QuotaExceeded):
            quotas.in_flight("alice", Lane.STREAMS)


# -- plain HTTP routes ------------------------------------------------------------------


async def _held_requests(
    gateway: RunningGateway, path: str, headers: dict[str, str], count: int
) -> list[asyncio.Task[aiohttp.ClientResponse]]:
    return [asyncio.create_task(gateway.get(path, headers=headers)) for _ in range(count)]


async def _settled(
    tasks: list[asyncio.Task[aiohttp.ClientResponse]], status: int, count: int
) -> list[asyncio.Task[aiohttp.ClientResponse]]:
    """Wait until `count` of the tasks ended with `status`; the others are still running."""
    pending: set[asyncio.Task[aiohttp.ClientResponse]] = set(tasks)
    async with asyncio.timeout(60):
        while sum(t.done() and t.result().status == status for t in tasks) < count:
            _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
    return [t for t in tasks if not t.done()]


async def test_slow_pass_through_requests_leave_other_clients_their_share(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """A client that comes first and sends 8 slow requests the route does not protect
    holds 4 of the route's 8 slots (the rest are 429 quota-exceeded); another client's
    protected calls go through meanwhile (security review, finding 1)."""
    gateway = await gateway_factory(
        upstream.url, route={"max_concurrency": 8, "methods": ["POST"]}, clients=CLIENTS
    )
    tasks = await _held_requests(gateway, "/tickets/v1/slow?hold=1", NOISY, 8)
    try:
        await upstream.wait_for_held(4)
        waiting = await _settled(tasks, 429, 4)
        assert len(waiting) == 4
        refused = next(t.result() for t in tasks if t.done())
        document = await refused.json(content_type=PROBLEM)
        assert kind(document) == "quota-exceeded"
        assert document["safe_to_retry"] is True
        assert "its share of the route's 8" in document["detail"]
        for n in range(4):
            quiet = await gateway.post(
                "/tickets/v1/issues", key=f"q{n}", json_body={}, headers=QUIET
            )
            assert quiet.status == 201
    finally:
        upstream.release_held()
        results = await asyncio.gather(*tasks)
    assert sorted(r.status for r in results) == [200] * 4 + [429] * 4
    assert upstream.held == 4


async def test_with_credential_scopes_a_newcomer_turns_the_share_on(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """Without [[clients]] a scope alone may fill the route; a newcomer refused for it
    (503) turns the share on: the first scope's next request is 429, and the newcomer
    gets the next slot given back."""
    gateway = await gateway_factory(upstream.url, route={"max_concurrency": 2, "methods": ["POST"]})
    tasks = await _held_requests(gateway, "/tickets/v1/slow?hold=1", NOISY, 2)
    try:
        await upstream.wait_for_held(2)
        newcomer = await gateway.post("/tickets/v1/issues", key="q1", json_body={}, headers=QUIET)
        assert newcomer.status == 503
        assert kind(await newcomer.json(content_type=PROBLEM)) == "route-saturated"
        again = await gateway.get("/tickets/v1/slow", headers=NOISY)
        assert again.status == 429
        assert kind(await again.json(content_type=PROBLEM)) == "quota-exceeded"
    finally:
        upstream.release_held()
        await asyncio.gather(*tasks)
    retried = await gateway.post("/tickets/v1/issues", key="q1", json_body={}, headers=QUIET)
    assert retried.status == 201


@dataclass
class SlowBodies:
    """An upstream whose answers send their headers and first bytes at once and the rest
    only when the test says: an answer still being read holds its connection."""

    url: str = ""
    started: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    finish: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        await response.prepare(request)
        await response.write(b"x" * 4096)
        self.started += 1
        self.changed.set()
        await self.finish.wait()
        await response.write(b"y" * 4096)
        await response.write_eof()
        return response

    async def wait_for_started(self, count: int) -> None:
        async with asyncio.timeout(60):
            while self.started < count:
                self.changed.clear()
                await self.changed.wait()


@pytest_asyncio.fixture
async def slow_bodies() -> AsyncIterator[SlowBodies]:
    server = SlowBodies()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", server.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield server
    finally:
        server.finish.set()
        await runner.cleanup()


async def test_an_answer_still_being_passed_on_holds_its_slot(
    gateway_factory: GatewayFactory, slow_bodies: SlowBodies
) -> None:
    """A pass-through answer too large to keep holds its slot until its last byte: the
    client that holds it is at its share, and the other client still gets the route's
    other slot (before, the slot went back with the headers while the connection stayed
    taken)."""
    gateway = await gateway_factory(
        slow_bodies.url,
        route={"max_concurrency": 2, "methods": ["POST"], "max_stored_response": "1KiB"},
        clients=CLIENTS,
    )
    async with aiohttp.ClientSession() as noisy:
        slow_bodies.finish.set()  # quiet's first request: answered whole
        first = await gateway.post("/tickets/v1/a", key="q1", json_body={}, headers=QUIET)
        assert first.status == 200
        slow_bodies.finish.clear()
        started = slow_bodies.started
        streaming = await noisy.get(gateway.url + "/tickets/v1/big", headers=NOISY)
        assert streaming.status == 200
        await slow_bodies.wait_for_started(started + 1)
        second = await gateway.get("/tickets/v1/big", headers=NOISY)
        assert second.status == 429
        assert kind(await second.json(content_type=PROBLEM)) == "quota-exceeded"
        quiet = asyncio.create_task(gateway.get("/tickets/v1/big", headers=QUIET))
        await slow_bodies.wait_for_started(started + 2)
        slow_bodies.finish.set()
        assert len(await streaming.read()) == 8192
        assert (await quiet).status == 200
    again = await gateway.get("/tickets/v1/big", headers=NOISY)
    assert again.status == 200


async def test_max_in_flight_counts_requests_passed_through(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """max_in_flight counts a scope's every request: two slow pass-through requests in
    flight make its protected call 429, with nothing recorded."""
    gateway = await gateway_factory(
        upstream.url, route={"methods": ["POST"]}, quotas={"max_in_flight": 2}
    )
    tasks = await _held_requests(gateway, "/tickets/v1/slow?hold=1", {}, 2)
    try:
        await upstream.wait_for_held(2)
        refused = await gateway.post("/tickets/v1/issues", key="f1", json_body={})
        assert refused.status == 429
        document = await refused.json(content_type=PROBLEM)
        assert kind(document) == "quota-exceeded"
        assert "2 requests in flight (limit 2)" in document["detail"]
        assert (await gateway.get("/operations/f1")).status == 404
    finally:
        upstream.release_held()
        await asyncio.gather(*tasks)
    assert (await gateway.post("/tickets/v1/issues", key="f1", json_body={})).status == 201


# -- MCP routes ---------------------------------------------------------------------------


@dataclass
class StreamingServer:
    """An MCP endpoint: a GET opens the server's stream (a ping every `ping` seconds, until
    the caller leaves); a tools/call answers at once, or once `slow` is set for a call
    whose arguments ask for it."""

    url: str = ""
    ping: float = 0.2
    streams: int = 0
    calls: int = 0
    slow: asyncio.Event = field(default_factory=asyncio.Event)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def post(self, request: web.Request) -> web.StreamResponse:
        message = json.loads(await request.read())
        if "id" not in message:
            return web.Response(status=202)
        self.calls += 1
        self.changed.set()
        if message["params"].get("arguments", {}).get("slow"):
            await self.slow.wait()
        result = {"content": [{"type": "text", "text": "done"}], "isError": False}
        return web.json_response({"jsonrpc": "2.0", "id": message["id"], "result": result})

    async def get(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        self.streams += 1
        self.changed.set()
        try:
            for _ in range(10_000):  # bounded: at most about half an hour of pings
                await response.write(b": ping\n\n")
                await asyncio.sleep(self.ping)
        except (ConnectionError, RuntimeError):
            pass
        return response

    async def wait_for(self, what: str, count: int) -> None:
        async with asyncio.timeout(60):
            while getattr(self, what) < count:
                self.changed.clear()
                await self.changed.wait()


@pytest_asyncio.fixture
async def mcp_server() -> AsyncIterator[StreamingServer]:
    server = StreamingServer()
    async with serve_mcp_handlers(server.post, server.get) as server.url:
        try:
            yield server
        finally:
            server.slow.set()


def _mcp_route(url: str, **options: Any) -> dict[str, Any]:
    return {"prefix": "/tools", "upstream": url, "kind": "mcp", "timeout": "30s", **options}


_ids = itertools.count(1)


def _call(key: str | None, **arguments: Any) -> bytes:
    params: dict[str, Any] = {"name": "create", "arguments": arguments}
    if key is not None:
        params["_meta"] = {"idempotencyKey": key}
    message = {"jsonrpc": "2.0", "id": next(_ids), "method": "tools/call", "params": params}
    return json.dumps(message).encode()


async def _tool_call(
    session: aiohttp.ClientSession, gateway: RunningGateway, headers: dict[str, str], body: bytes
) -> tuple[int, dict[str, Any]]:
    async with session.post(
        gateway.url + "/tools", data=body, headers={**MCP_HEADERS, **headers}
    ) as response:
        return response.status, await response.json(content_type=None)


class OpenStreams:
    """Server streams a test opened through the gateway; all closed when it ends."""

    def __init__(self, session: aiohttp.ClientSession, gateway: RunningGateway) -> None:
        self._session = session
        self._gateway = gateway
        self.open: list[aiohttp.ClientResponse] = []

    async def open_one(self, headers: dict[str, str]) -> aiohttp.ClientResponse:
        response = await self._session.get(
            self._gateway.url + "/tools", headers={**STREAM_HEADERS, **headers}
        )
        if response.status == 200:
            self.open.append(response)
        else:
            await response.read()
        return response

    def close(self) -> None:
        for response in self.open:
            response.close()


@pytest_asyncio.fixture
async def streams_of(
    gateway_factory: GatewayFactory,
) -> AsyncIterator[list[OpenStreams]]:
    """Streams the test opened, closed before its gateways stop (hence the dependency)."""
    made: list[OpenStreams] = []
    yield made
    for streams in made:
        streams.close()


async def _gateway_with_streams(
    gateway_factory: GatewayFactory,
    made: list[OpenStreams],
    session: aiohttp.ClientSession,
    url: str,
    **options: Any,
) -> tuple[RunningGateway, OpenStreams]:
    quotas = options.pop("quotas", {})
    clients = options.pop("clients", CLIENTS)
    gateway = await gateway_factory(
        url, route=_mcp_route(url, **options), clients=clients, quotas=quotas
    )
    streams = OpenStreams(session, gateway)
    made.append(streams)
    return gateway, streams


async def test_server_streams_never_take_a_calls_slot(
    gateway_factory: GatewayFactory,
    mcp_server: StreamingServer,
    streams_of: list[OpenStreams],
) -> None:
    """A scope alone holding as many server streams as the route has slots leaves every
    slot for calls: another scope's protected call is answered (before, the streams
    held the route's pooled connections and the call could not connect)."""
    async with aiohttp.ClientSession() as session:
        gateway, streams = await _gateway_with_streams(
            gateway_factory, streams_of, session, mcp_server.url,
            clients=None, max_concurrency=4, quotas={"max_streams": 8},
        )  # fmt: skip
        for _ in range(4):
            assert (await streams.open_one(NOISY)).status == 200
        await mcp_server.wait_for("streams", 4)
        status, answer = await _tool_call(session, gateway, QUIET, _call("k1", title="a"))
        assert status == 200, answer
        assert answer["result"]["isError"] is False
        assert mcp_server.calls == 1


async def test_a_clients_streams_past_its_share_are_refused_in_json_rpc_form(
    gateway_factory: GatewayFactory,
    mcp_server: StreamingServer,
    streams_of: list[OpenStreams],
) -> None:
    """On a route of two clients, a client's third stream of a 4-slot route is 429 with a
    JSON-RPC error whose data is the quota-exceeded problem, before the other client came;
    the other client then opens its own."""
    async with aiohttp.ClientSession() as session:
        _, streams = await _gateway_with_streams(
            gateway_factory, streams_of, session, mcp_server.url,
            max_concurrency=4, quotas={"max_streams": 8},
        )  # fmt: skip
        assert (await streams.open_one(NOISY)).status == 200
        assert (await streams.open_one(NOISY)).status == 200
        refused = await streams.open_one(NOISY)
        assert refused.status == 429
        error = (await refused.json())["error"]
        assert kind(error["data"]) == "quota-exceeded"
        assert "server streams open" in error["message"]
        assert (await streams.open_one(QUIET)).status == 200
        assert (await streams.open_one(QUIET)).status == 200


async def test_max_streams_caps_one_clients_streams(
    gateway_factory: GatewayFactory,
    mcp_server: StreamingServer,
    streams_of: list[OpenStreams],
) -> None:
    """A client at max_streams gets 429 for another stream, alone on the route too; its
    calls are not counted against it."""
    async with aiohttp.ClientSession() as session:
        gateway, streams = await _gateway_with_streams(
            gateway_factory, streams_of, session, mcp_server.url, quotas={"max_streams": 2}
        )
        assert (await streams.open_one(NOISY)).status == 200
        assert (await streams.open_one(NOISY)).status == 200
        refused = await streams.open_one(NOISY)
        assert refused.status == 429
        assert "2 server streams open (limit 2)" in (await refused.json())["error"]["message"]
        status, answer = await _tool_call(session, gateway, NOISY, _call("k1", title="a"))
        assert (status, answer["result"]["isError"]) == (200, False)


async def test_a_stream_is_ended_at_max_stream_and_its_slot_given_back(
    gateway_factory: GatewayFactory,
    mcp_server: StreamingServer,
    streams_of: list[OpenStreams],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A lively stream (a ping every 0.2 s) is ended cleanly at the route's max_stream,
    the gateway says so in its log, and the client may open a new one."""
    caplog.set_level(logging.INFO, logger="gateway.mcp")
    async with aiohttp.ClientSession() as session:
        _, streams = await _gateway_with_streams(
            gateway_factory, streams_of, session, mcp_server.url,
            max_stream="1s", quotas={"max_streams": 1},
        )  # fmt: skip
        stream = await streams.open_one(NOISY)
        assert stream.status == 200
        async with asyncio.timeout(60):
            received = await stream.read()  # to the clean end the gateway writes
        assert received.startswith(b": ping")
        assert any(
            getattr(record, "event", None) == "mcp_stream_ended" for record in caplog.records
        )
        assert (await streams.open_one(NOISY)).status == 200


async def test_a_tool_call_past_its_share_is_an_is_error_result_like_route_saturated(
    gateway_factory: GatewayFactory, mcp_server: StreamingServer
) -> None:
    """A protected call past the client's share is answered as a route-saturated one is:
    an isError result whose _meta.idempotency is the quota-exceeded problem, nothing
    sent or recorded."""
    gateway = await gateway_factory(
        mcp_server.url, route=_mcp_route(mcp_server.url, max_concurrency=2), clients=CLIENTS
    )
    async with aiohttp.ClientSession() as session:
        slow = asyncio.create_task(_tool_call(session, gateway, NOISY, _call("n1", slow=True)))
        await mcp_server.wait_for("calls", 1)
        status, answer = await _tool_call(session, gateway, NOISY, _call("n2", title="b"))
        assert status == 200
        result = answer["result"]
        assert result["isError"] is True
        problem = result["_meta"]["idempotency"]
        assert kind(problem) == "quota-exceeded"
        assert problem["safe_to_retry"] is True
        assert "over its quota" in result["content"][0]["text"]
        assert mcp_server.calls == 1
        status, answer = await _tool_call(session, gateway, QUIET, _call("q1", title="a"))
        assert (status, answer["result"]["isError"]) == (200, False)
        mcp_server.slow.set()
        assert (await slow)[0] == 200
    assert (await gateway.get("/operations/n2", headers=NOISY)).status == 404
