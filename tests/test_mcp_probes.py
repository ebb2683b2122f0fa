"""MCP probes: a tool call whose answer was lost is settled by asking the server.

The gateway runs as production runs it (a subprocess), in front of the
official SDK's MCP server (tests/mcp_upstream.py), which counts effects and
here also has the read-only lookup a probe calls: `find_ticket`, answering
`{"found": ..., "ticket": ...}` for the idempotency key a call carried (the
forwarded key). `lose_connection` makes a call `unknown`: the tool runs (or,
when told, returns without applying its effect) and the connection is cut
where its answer would go, so the gateway cannot know.

What must hold is what holds for HTTP probes: `true` at `applied_pointer`
settles `completed` with the probe's result as the receipt (marked as the
probe's), `false` releases the key only after `not_applied_after`, anything
else leaves it `unknown` with evidence, a verdict counts only for the attempt
it was asked about, and the probe speaks with the route's credentials on a
session of its own, never the caller's.

The last test runs `make run`'s pair, the demo config's MCP route and probe in
front of examples/mcp_server.py and its `find_ticket`.

Background sweeps are off (`sweep_interval` 60s): a lookup or a retry is what
probes, so each test decides when the gateway asks. Every wait is for an
event (a state, a request reaching the server), bounded only against a hang.
Retries go through the official SDK, which checks a result's structuredContent
against the called tool's output schema: a probe-made receipt must not pass for
the tool's own result, and is replayed as the `isError` result that says so.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import quote

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web
from conftest import GatewayFactory
from harness import ADMIN_ENV, ROOT, GatewayProcess, force_release, spawn
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from mcp_upstream import (
    LEGACY,
    MODERN,
    CountingMcpServer,
    McpCall,
    Ticket,
    call_with_key,
    mcp_client,
)
from mcp_upstream import (
    example_mcp_server as started_example_server,
)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.config import DEFAULT_CONFIG_PATH, ENV_PREFIX, load_settings
from gateway.mcp.sentences import PROBED_SENTENCE
from gateway.telemetry import attributes as attr
from gateway.telemetry.provider import use_tracer_provider

if TYPE_CHECKING:
    from mcp.client.client import ConnectMode

PREFIX = "/tools"
KEY = "probe-77:0:c1"
CALLER = {"Authorization": "Bearer caller-secret"}
"""The caller's credential: its scope, and what the probe must never carry."""
ROUTE_HEADERS = {"X-Route-Token": "route-secret"}
PROBE_HEADERS = {"X-Probe": "probe-secret"}
IDEMPOTENCY = {"lease": "1s", "sweep_interval": "60s"}
EXAMPLE = ROOT / DEFAULT_CONFIG_PATH
"""The config `make run` serves."""
LIMIT = 60.0
"""Seconds before a wait is taken for a hang: only a broken gateway comes near it."""

ProbeAnswer = Literal["found", "is_error", "no_value", "not_boolean"]


class ProbedServer(CountingMcpServer):
    """The counting MCP server with `find_ticket`, the lookup a probe calls.

    `answer` says what the lookup answers (the truth, or something a probe must
    not believe); `holds` hold back the next lookups' answers (decided when they
    arrive, sent when the test sets the event), as a slow server would;
    `unapplied` makes the next `lose_connection` calls return without applying
    their effect (sent, never applied, and no answer comes back).
    """

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.answer: ProbeAnswer = "found"
        self.holds: list[asyncio.Event] = []
        self.unapplied = 0
        self.ticket_keys: list[tuple[str | None, Ticket]] = []
        self._probe_arrived = asyncio.Event()

    @property
    def probes(self) -> list[McpCall]:
        """Every `find_ticket` call that reached the server, in arrival order."""
        return [call for call in self.calls_seen if call.tool == "find_ticket"]

    def calls_of(self, tool: str) -> int:
        return sum(1 for call in self.calls_seen if call.tool == tool)

    async def wait_for_probes(self, count: int) -> None:
        """Until `count` lookups have reached the server (answered or held)."""
        async with asyncio.timeout(LIMIT):
            while len(self.probes) < count:
                self._probe_arrived.clear()
                await self._probe_arrived.wait()

    def _build(self) -> MCPServer:
        mcp = super()._build()
        mcp.add_tool(
            self._find_ticket,
            name="find_ticket",
            annotations=ToolAnnotations(read_only_hint=True),
        )
        return mcp

    async def _find_ticket(self, idempotency_key: str, ctx: Context) -> CallToolResult:
        """Find the ticket the call that carried this idempotency key created."""
        self._seen(ctx)
        self._probe_arrived.set()
        ticket = next((t for key, t in self.ticket_keys if key == idempotency_key), None)
        hold = self.holds.pop(0) if self.holds else None
        if hold is not None:
            await hold.wait()
        structured: dict[str, Any] = {"found": ticket is not None, "ticket": ticket}
        if self.answer == "is_error":
            return CallToolResult(
                content=[TextContent(type="text", text="the ticket index is being rebuilt")],
                is_error=True,
            )
        if self.answer == "no_value":
            structured = {"ticket": ticket}
        elif self.answer == "not_boolean":
            structured = {**structured, "found": "maybe"}
        return CallToolResult(
            content=[TextContent(type="text", text=json.dumps(structured))],
            structured_content=structured,
        )

    async def _lose_connection(self, title: str, ctx: Context) -> Ticket:
        """Create a ticket (unless told not to); the connection is then cut before the
        answer is written."""
        if self.unapplied > 0:
            self.unapplied -= 1
            self._seen(ctx)
            return Ticket(id="T-0", title=title)  # never written: the connection is cut
        return await super()._lose_connection(title, ctx)

    def _new_ticket(self, title: str, ctx: Context) -> Ticket:
        ticket = super()._new_ticket(title, ctx)
        self.ticket_keys.append((self.effects[-1].key, ticket))
        return ticket


@pytest_asyncio.fixture
async def server() -> AsyncIterator[ProbedServer]:
    async with ProbedServer() as started:
        yield started


def gateway_for(
    processes: list[GatewayProcess],
    tmp_path: Path,
    upstream: str,
    *,
    store_url: str | None = None,
    admin: bool = False,
    max_call: str = "1h",
    **probe: Any,
) -> GatewayProcess:
    """The gateway in a subprocess, its MCP route at /tools probing with `find_ticket`,
    which sees the tickets of every caller's `lose_connection` calls (`applies_to`).

    The route's and the probe's header values go in by environment: the rendered
    config file masks them. `max_call` bounds the window a "not found" waits for."""
    table = {
        "tool": "find_ticket",
        "arguments": {"idempotency_key": "{forwarded_key}"},
        "applied_pointer": "/found",
        "not_applied_after": "1h",
        "applies_to": ["lose_connection"],
        "sees_all_callers": True,
        **probe,
    }
    route = {
        "name": "tools",
        "prefix": PREFIX,
        "kind": "mcp",
        "probe": table,
        "max_call": max_call,
    }
    env = {
        f"{ENV_PREFIX}ROUTES__0__UPSTREAM_HEADERS": json.dumps(ROUTE_HEADERS),
        f"{ENV_PREFIX}ROUTES__0__PROBE__HEADERS": json.dumps(PROBE_HEADERS),
        **(ADMIN_ENV if admin else {}),
    }
    return spawn(
        processes,
        tmp_path,
        upstream,
        route=route,
        idempotency=IDEMPOTENCY,
        env=env,
        store_url=store_url,
    )


async def call_lost(gateway: GatewayProcess, *, mode: ConnectMode = LEGACY) -> CallToolResult:
    """`lose_connection` with the key, on a session of its own, as the caller."""
    async with (
        asyncio.timeout(LIMIT),
        mcp_client(gateway.url + PREFIX, headers=CALLER, mode=mode) as client,
    ):
        return await call_with_key(client, "lose_connection", {"title": "Printer"}, KEY)


async def calibration_call(gateway: GatewayProcess, server: ProbedServer) -> None:
    """A `lose_connection` call the server answers (spared): a completed call of the kind
    the probe is calibrated against, in the caller's scope, before its "not found" counts."""
    server.spared += 1
    async with (
        asyncio.timeout(LIMIT),
        mcp_client(gateway.url + PREFIX, headers=CALLER, mode=LEGACY) as client,
    ):
        result = await call_with_key(
            client, "lose_connection", {"title": "Sample"}, f"sample-{len(server.tickets)}"
        )
    assert not result.is_error, result


async def lookup(gateway: GatewayProcess) -> dict[str, Any]:
    """`GET /operations/<key>` as the caller: it probes an `unknown` operation when due."""
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{gateway.url}/operations/{quote(KEY, safe='')}", headers=CALLER) as found,
    ):
        assert found.status == 200, await found.text()
        document: dict[str, Any] = await found.json()
        return document


async def lookup_until(
    gateway: GatewayProcess, done: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """Look the key up (probing when due) until `done` holds for the operation."""
    async with asyncio.timeout(LIMIT):
        while True:
            operation = await lookup(gateway)
            if done(operation):
                return operation
            await asyncio.sleep(0.1)


async def call_again(
    gateway: GatewayProcess,
    tool: str = "lose_connection",
    arguments: dict[str, Any] | None = None,
    *,
    prefix: str = PREFIX,
    mode: ConnectMode = LEGACY,
) -> CallToolResult:
    """The retry, through the official SDK: what an agent gets."""
    async with (
        asyncio.timeout(LIMIT),
        mcp_client(gateway.url + prefix, headers=CALLER, mode=mode) as client,
    ):
        called = arguments if arguments is not None else {"title": "Printer"}
        return await call_with_key(client, tool, called, KEY)


def probed(result: CallToolResult) -> dict[str, Any]:
    """What a probe-made receipt says of the probe: the tool asked and its result."""
    assert result.is_error is True, result
    assert isinstance(result.content[0], TextContent)
    assert result.content[0].text == PROBED_SENTENCE
    found: dict[str, Any] = idempotency_meta(result)["idempotencyProbe"]
    return found


def idempotency_meta(result: CallToolResult) -> dict[str, Any]:
    meta: dict[str, Any] = dict(result.meta or {})
    return meta


def evidence_of(operation: dict[str, Any]) -> str:
    return "\n".join(item["detail"] for item in operation["evidence"])


async def test_an_unknown_call_is_settled_by_its_probe_and_the_retry_replays_its_result(
    processes: list[GatewayProcess], tmp_path: Path, server: ProbedServer
) -> None:
    """The tool ran and its answer was lost: the retry's probe finds the ticket, the call
    is `completed` by the probe, and the retry gets the probe's result, marked as the
    probe's; the tool ran once."""
    gateway = gateway_for(processes, tmp_path, server.url)
    lost = await call_lost(gateway)
    assert idempotency_meta(lost)["idempotency"]["type"] == "upstream-connection-lost"

    retry = await call_again(gateway)

    ticket = server.tickets[0]
    probe = probed(retry)
    assert probe["tool"] == "find_ticket"
    assert probe["result"]["structuredContent"] == {"found": True, "ticket": ticket}
    assert idempotency_meta(retry)["idempotencyReplayed"] is True
    operation = await lookup(gateway)
    assert (operation["state"], operation["attempts"]) == ("completed", 1)
    assert operation["resolution"]["by"] == "probe"
    assert operation["result"]["_meta"]["idempotencyProbe"]["tool"] == "find_ticket"
    assert server.count == 1
    assert server.probes[0].arguments == {"idempotency_key": operation["id"]}


async def test_the_probe_has_a_session_of_its_own_and_never_the_callers_credentials(
    processes: list[GatewayProcess], tmp_path: Path, server: ProbedServer
) -> None:
    """The probe opens its own session (initialize as the gateway's probe, its own
    Mcp-Session-Id, a DELETE at the end) and carries the route's upstream_headers and
    its own headers, never the caller's Authorization."""
    gateway = gateway_for(processes, tmp_path, server.url)
    await call_lost(gateway)
    assert (await lookup(gateway))["state"] == "completed"

    effect = server.effects[0]
    assert effect.headers["authorization"] == CALLER["Authorization"]  # the gateway had it
    probe = server.probes[0]
    assert "authorization" not in probe.headers
    assert probe.headers["x-route-token"] == ROUTE_HEADERS["X-Route-Token"]
    assert probe.headers["x-probe"] == PROBE_HEADERS["X-Probe"]
    assert probe.session_id is not None
    assert probe.session_id != effect.session_id
    assert probe.protocol_version == "2025-11-25"
    assert "idempotencyKey" not in probe.meta

    opened = [
        exchange
        for exchange in server.requests
        if exchange.method == "POST"
        and exchange.json.get("method") == "initialize"
        and exchange.json["params"]["clientInfo"]["name"] == "idempotency-gateway-probe"
    ]
    assert len(opened) == 1
    assert "authorization" not in opened[0].headers
    assert opened[0].response_headers is not None
    assert opened[0].response_headers["mcp-session-id"] == probe.session_id
    ended = [
        exchange
        for exchange in server.requests
        if exchange.method == "DELETE"
        and exchange.headers.get("mcp-session-id") == probe.session_id
    ]
    assert len(ended) == 1
    assert "authorization" not in ended[0].headers


async def test_a_call_that_never_applied_stays_unknown_before_not_applied_after(
    processes: list[GatewayProcess], tmp_path: Path, server: ProbedServer
) -> None:
    """The call reached the server, which did not apply it, and the answer was lost: the
    probe's "not found" is evidence only while the attempt may still land (here for an
    hour); the call stays `unknown` and its retry is not sent."""
    gateway = gateway_for(processes, tmp_path, server.url, not_applied_after="1h")
    server.unapplied = 1
    await call_lost(gateway)

    operation = await lookup(gateway)

    assert len(server.probes) == 1
    assert operation["state"] == "unknown"
    assert "probe answered find_ticket with /found = false (not applied)" in evidence_of(operation)
    assert "kept unknown" in evidence_of(operation)
    retry = await call_lost(gateway)
    assert idempotency_meta(retry)["idempotency"]["type"] == "outcome-unknown"
    assert server.calls_of("lose_connection") == 1
    assert server.count == 0


async def test_a_call_that_never_applied_is_released_after_not_applied_after(
    processes: list[GatewayProcess], tmp_path: Path, server: ProbedServer
) -> None:
    """Once `not_applied_after` passed since the attempt's last possible send, the probe's
    "not found" releases the key; the retry is then sent, and the tool runs once."""
    gateway = gateway_for(processes, tmp_path, server.url, not_applied_after="1s", max_call="1s")
    await calibration_call(gateway, server)
    server.unapplied = 1
    await call_lost(gateway)

    released = await lookup_until(gateway, lambda operation: operation["state"] != "unknown")

    assert released["state"] == "released"
    assert released["resolution"]["by"] == "probe"
    assert server.count == 1  # the calibration call
    await call_lost(gateway)  # attempt 2: applied, and its answer lost too
    settled = await lookup_until(gateway, lambda operation: operation["state"] != "unknown")
    assert (settled["state"], settled["attempts"]) == ("completed", 2)
    assert server.count == 2


@pytest.mark.parametrize(
    ("answer", "evidence"),
    [
        ("is_error", "probe find_ticket answered isError: true (the ticket index is being"),
        ("no_value", "probe find_ticket's structuredContent has no value at /found"),
        ("not_boolean", 'probe find_ticket answered /found = "maybe", neither true'),
    ],
)
async def test_an_answer_that_is_not_a_verdict_leaves_the_call_unknown(
    processes: list[GatewayProcess],
    tmp_path: Path,
    server: ProbedServer,
    answer: ProbeAnswer,
    evidence: str,
) -> None:
    """A lookup that fails (isError), or says nothing true or false at the pointer, is
    no verdict: evidence that says which, and the call stays `unknown` (with no grace at
    all, so that an answer misread as "not applied" would release it at once)."""
    gateway = gateway_for(processes, tmp_path, server.url, not_applied_after="0s", max_call="1s")
    await calibration_call(gateway, server)
    server.answer = answer
    await call_lost(gateway)
    # Past the window (lease 1 s, max_call 1 s): a "not found" would count now.
    await asyncio.sleep(2.2)

    operation = await lookup(gateway)

    assert len(server.probes) == 1
    assert operation["state"] == "unknown"
    assert evidence in evidence_of(operation), operation["evidence"]
    retry = await call_lost(gateway)
    assert idempotency_meta(retry)["idempotency"]["type"] == "outcome-unknown"
    assert server.calls_of("lose_connection") == 2  # the calibration call and the lost one


async def test_a_slow_probe_about_attempt_1_changes_nothing_for_attempt_2(
    processes: list[GatewayProcess], tmp_path: Path, server: ProbedServer
) -> None:
    """A probe about attempt 1 (never applied) is still out when an operator releases the
    key and attempt 2 is sent, applied and lost; its late "not found" is about attempt 1
    and is kept as evidence only: attempt 2 is never released, nor sent a third time.
    (No grace, so the verdict would count at once were its attempt still current.)"""
    gateway = gateway_for(
        processes, tmp_path, server.url, not_applied_after="0s", admin=True, max_call="1s"
    )
    server.unapplied = 1
    await call_lost(gateway)
    # With no grace, only a call completed after attempt 1's send calibrates the probe.
    await calibration_call(gateway, server)
    # Past attempt 1's window (lease 1 s, max_call 1 s, no grace): P1's "not found" would
    # release it at once, were attempt 1 still current when it arrives.
    await asyncio.sleep(2.2)
    held = asyncio.Event()
    server.holds.append(held)  # P1: decided when it arrives ("not found"), answered on `held`
    slow_lookup = asyncio.create_task(lookup(gateway))
    try:
        await server.wait_for_probes(1)
        async with aiohttp.ClientSession() as session:
            await force_release(
                session, gateway, KEY, note="not in the ticket system", headers=CALLER
            )
        attempt_2 = await call_lost(gateway)
        assert idempotency_meta(attempt_2)["idempotency"]["type"] == "upstream-connection-lost"
        assert server.count == 2  # the calibration call, and attempt 2
    finally:
        held.set()
        await slow_lookup  # P1's verdict arrives now, about attempt 1

    operation = await lookup(gateway)
    assert operation["attempts"] == 2
    assert operation["state"] in ("unknown", "completed"), operation  # never released
    assert "no longer current" in evidence_of(operation)
    retry = await call_again(gateway)
    if "idempotencyProbe" in idempotency_meta(retry):
        assert probed(retry)["tool"] == "find_ticket"
    else:
        assert idempotency_meta(retry)["idempotency"]["type"] == "outcome-unknown"
    assert server.calls_of("lose_connection") == 3
    assert server.count == 2


@pytest.mark.postgres
async def test_an_unknown_call_is_settled_by_its_probe_on_postgresql(
    postgres_url: str, processes: list[GatewayProcess], tmp_path: Path, server: ProbedServer
) -> None:
    """The same settlement with the store on PostgreSQL."""
    gateway = gateway_for(processes, tmp_path, server.url, store_url=postgres_url)
    await call_lost(gateway)

    retry = await call_again(gateway)

    assert probed(retry)["tool"] == "find_ticket"
    operation = await lookup(gateway)
    assert (operation["state"], operation["resolution"]["by"]) == ("completed", "probe")
    assert server.count == 1


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """Gateways made after it trace to this exporter, whatever the environment says.
    Request it before `gateway_factory`: the gateways stop before the provider does."""
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    use_tracer_provider(provider)
    try:
        yield exporter
    finally:
        use_tracer_provider(None)
        provider.shutdown()


async def test_the_probe_has_a_span_naming_its_tool(
    spans: InMemorySpanExporter, gateway_factory: GatewayFactory, server: ProbedServer
) -> None:
    """With tracing on, an MCP probe's span says what was asked (tools/call of the probe's
    tool, not an HTTP path) and what it found, like an HTTP probe's."""
    table = {
        "tool": "find_ticket",
        "arguments": {"idempotency_key": "{forwarded_key}"},
        "applied_pointer": "/found",
        "sees_all_callers": True,
    }
    route = {"name": "tools", "prefix": PREFIX, "kind": "mcp", "probe": table}
    gateway = await gateway_factory(server.url, route=route)
    async with asyncio.timeout(LIMIT), mcp_client(gateway.url + PREFIX, headers=CALLER) as client:
        await call_with_key(client, "lose_connection", {"title": "Printer"}, KEY)
    spans.clear()

    found = await gateway.get(f"/operations/{quote(KEY, safe='')}", headers=CALLER)

    assert (await found.json())["state"] == "completed"
    probes = [span for span in spans.get_finished_spans() if span.name == "idempotency.probe"]
    assert len(probes) == 1
    attributes = probes[0].attributes or {}
    assert attributes[attr.MCP_METHOD_NAME] == "tools/call"
    assert attributes[attr.GEN_AI_TOOL_NAME] == "find_ticket"
    assert attributes[attr.HTTP_REQUEST_METHOD] == "POST"
    assert attr.URL_TEMPLATE not in attributes
    assert attributes[attr.PROBE_RESULT] == "applied"
    assert attributes[attr.RESOLVED_BY] == "probe"


# -- a server of the stateless generation only --------------------------------------


@pytest_asyncio.fixture
async def stateless_only(server: ProbedServer) -> AsyncIterator[tuple[str, list[bytes]]]:
    """The SDK server behind a front that refuses `initialize` as a server of the
    2026-07-28 generation only would, and passes everything else on as it is: its URL,
    and the bodies of the initialize requests it refused."""
    refused: list[bytes] = []
    client = aiohttp.ClientSession(auto_decompress=False)

    async def relay(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if request.method == "POST" and json.loads(body).get("method") == "initialize":
            refused.append(body)
            error = {
                "jsonrpc": "2.0",
                "id": json.loads(body).get("id"),
                "error": {"code": -32022, "message": "Unsupported protocol version"},
            }
            return web.json_response(error, status=400)
        headers = {
            name: value
            for name, value in request.headers.items()
            if name.lower() not in ("host", "content-length", "transfer-encoding")
        }
        try:
            async with client.request(
                request.method, server.url, headers=headers, data=body or None
            ) as answer:
                payload = await answer.read()
        except aiohttp.ClientError:  # the server cut the connection (lose_connection): so do we
            assert request.transport is not None
            request.transport.close()
            raise
        kept = {
            name: value
            for name, value in answer.headers.items()
            if name.lower() not in ("content-length", "transfer-encoding", "connection")
        }
        return web.Response(status=answer.status, headers=kept, body=payload)

    app = web.Application()
    app.router.add_route("*", "/mcp", relay)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/mcp", refused
    finally:
        await runner.cleanup()
        await client.close()


async def test_a_server_that_refuses_initialize_is_probed_in_one_stateless_request(
    processes: list[GatewayProcess],
    tmp_path: Path,
    server: ProbedServer,
    stateless_only: tuple[str, list[bytes]],
) -> None:
    """A server that speaks only 2026-07-28 refuses the probe's `initialize`; the probe
    then asks in one stateless request (protocol version, Mcp-Method and Mcp-Name
    headers, the reserved `_meta` keys), which the official SDK server answers."""
    url, refused = stateless_only
    gateway = gateway_for(processes, tmp_path, url)
    await call_lost(gateway, mode=MODERN)

    retry = await call_again(gateway, mode=MODERN)

    assert probed(retry)["tool"] == "find_ticket"
    assert (await lookup(gateway))["state"] == "completed"
    assert server.count == 1
    assert [json.loads(body)["params"]["clientInfo"]["name"] for body in refused] == [
        "idempotency-gateway-probe"
    ]
    probe = server.probes[0]
    assert probe.session_id is None
    assert probe.protocol_version == "2026-07-28"
    assert (probe.headers["mcp-method"], probe.headers["mcp-name"]) == ("tools/call", "find_ticket")
    assert probe.meta["io.modelcontextprotocol/clientInfo"]["name"] == "idempotency-gateway-probe"
    assert "authorization" not in probe.headers
    assert probe.headers["x-route-token"] == ROUTE_HEADERS["X-Route-Token"]


# -- the demo: examples/mcp_server.py behind config/gateway.toml's MCP route ---------


@pytest_asyncio.fixture
async def example_server() -> AsyncIterator[str]:
    """examples/mcp_server.py as `make run` starts it, on a port the OS picks."""
    async with started_example_server(LIMIT) as url:
        yield url


@pytest.mark.slow
async def test_the_demo_probe_settles_a_call_whose_gateway_died_after_the_server_answered(
    processes: list[GatewayProcess], tmp_path: Path, example_server: str
) -> None:
    """`make run`'s pair: the demo config's MCP route and probe, the example server's
    `find_ticket`. The gateway dies (kill -9) once the server has created the ticket and
    before the answer is recorded; the next gateway finds the call `unknown` and its
    probe settles it `completed` from the ticket the server recorded, so the retry gets
    the probe's result and no second ticket is created."""
    demo = load_settings(EXAMPLE, environ={}).routes[1]
    assert demo.kind == "mcp"
    assert demo.probe is not None
    route = {**demo.model_dump(), "upstream": example_server}
    options: dict[str, Any] = {"route": route, "idempotency": IDEMPOTENCY}
    url = demo.prefix
    first = spawn(processes, tmp_path, example_server, fault="crash_after_response", **options)
    async with asyncio.timeout(LIMIT):
        with pytest.raises(BaseException):  # noqa: B017, PT011 (the gateway vanished mid-call)
            async with mcp_client(first.url + url, headers=CALLER) as client:
                await call_with_key(client, "create_ticket", {"title": "Printer"}, KEY)
    first.kill()
    second = spawn(processes, tmp_path, example_server, name="gw2", **options)

    settled = await lookup_until(second, lambda operation: operation["state"] == "completed")

    assert settled["resolution"]["by"] == "probe"
    probe = settled["result"]["_meta"]["idempotencyProbe"]
    ticket = probe["result"]["structuredContent"]["ticket"]
    assert ticket["idempotency_key"] == settled["id"]  # what the server received
    assert probe["tool"] == "find_ticket"
    retry = await call_again(second, "create_ticket", prefix=url)
    assert probed(retry)["result"]["structuredContent"] == {"found": True, "ticket": ticket}
    assert idempotency_meta(retry)["idempotencyReplayed"] is True
    async with asyncio.timeout(LIMIT), mcp_client(example_server) as client:
        listed = await client.call_tool("list_tickets", {})
    assert listed.structured_content == {"items": [ticket]}


@pytest.mark.slow
async def test_the_demo_servers_slow_switch_ends_a_call_unknown_and_its_probe_finds_it_late(
    processes: list[GatewayProcess], tmp_path: Path, example_server: str
) -> None:
    """The README's slow tool, over MCP: `create_ticket`'s `delay_seconds` outlasts the
    route's timeout, so the call is `unknown`; the server still creates the ticket (a
    caller that left does not cancel it), and the demo probe then finds it: `completed`,
    one ticket."""
    demo = load_settings(EXAMPLE, environ={}).routes[1]
    route = {**demo.model_dump(), "upstream": example_server, "timeout": "1s"}
    gateway = spawn(processes, tmp_path, example_server, route=route, idempotency=IDEMPOTENCY)
    slow = {"title": "Printer", "delay_seconds": 3}
    async with (
        asyncio.timeout(LIMIT),
        mcp_client(gateway.url + demo.prefix, headers=CALLER) as client,
    ):
        timed_out = await call_with_key(client, "create_ticket", slow, KEY)
    assert idempotency_meta(timed_out)["idempotency"]["state"] == "unknown", timed_out

    settled = await lookup_until(gateway, lambda operation: operation["state"] == "completed")

    assert settled["resolution"]["by"] == "probe"
    async with asyncio.timeout(LIMIT), mcp_client(example_server) as client:
        listed = await client.call_tool("list_tickets", {})
    [ticket] = listed.structured_content["items"]  # type: ignore[index]
    assert ticket["idempotency_key"] == settled["id"]
