"""OpenTelemetry tracing: one trace from the agent through the gateway to the tool.

Real servers on loopback, the real SDK: gateways in this process trace to an
`InMemorySpanExporter` handed to them with `use_tracer_provider` (not OTel's
global provider, which can be set once per process and would then trace
every other test's gateways in this worker too); one gateway runs as
`python -m gateway serve`, configured by OTEL_* variables only, and exports
OTLP/HTTP to a receiver in this test.
"""

from __future__ import annotations

import asyncio
import gzip
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web
from conftest import GatewayFactory
from harness import GatewayProcess, spawn
from mcp_upstream import CountingMcpServer, call_with_key, mcp_client
from opentelemetry import propagate
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.semconv.attributes import (
    error_attributes,
    http_attributes,
    server_attributes,
    url_attributes,
)
from opentelemetry.trace import SpanKind, StatusCode, format_span_id, format_trace_id
from upstream import CountingUpstream, effects_probe

from gateway.telemetry import NO_TRACER
from gateway.telemetry import attributes as attr
from gateway.telemetry.provider import choose, use_tracer_provider, wanted
from gateway.telemetry.server import server_span_middleware
from gateway.telemetry.web import TRACER

OTEL_VARIABLES = (
    "OTEL_SDK_DISABLED",
    "OTEL_TRACES_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
    "OTEL_PROPAGATORS",
)
ENDPOINT = "http://127.0.0.1:9"
"""Never contacted: the environment tests only build the exporter, and shut it down at once."""
BODY = {"title": "Printer on fire", "card": "body-secret-4111111111111111"}
PROBE = effects_probe(by="operation_id")


@pytest.fixture(autouse=True)
def no_otel_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever the environment running the suite says, these tests say it themselves."""
    for name in OTEL_VARIABLES:
        monkeypatch.delenv(name, raising=False)


class Traced:
    """The provider gateways created in a test trace to, and what they recorded."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))

    @property
    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        return [span for span in self.spans if span.name == name]

    def one(self, name: str) -> ReadableSpan:
        found = self.named(name)
        assert len(found) == 1, [span.name for span in self.spans]
        return found[0]


@pytest.fixture
def traced() -> Iterator[Traced]:
    """Request it before `gateway_factory`: gateways made after it trace to it."""
    made = Traced()
    use_tracer_provider(made.provider)
    try:
        yield made
    finally:
        use_tracer_provider(None)
        made.provider.shutdown()


class Tool:
    """A tool API that continues the trace it is sent, as an instrumented service would."""

    def __init__(self, provider: TracerProvider) -> None:
        self._tracer = provider.get_tracer("tool")
        self.headers: list[dict[str, str]] = []
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.headers.append({name.lower(): value for name, value in request.headers.items()})
        with self._tracer.start_as_current_span(
            "tool: create ticket", context=propagate.extract(request.headers), kind=SpanKind.SERVER
        ):
            await request.read()
            return web.json_response({"id": "T-1"}, status=201)


@pytest_asyncio.fixture
async def tool(traced: Traced) -> AsyncIterator[Tool]:
    made = Tool(traced.provider)
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", made.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    made.url = f"http://{host}:{port}"
    yield made
    await runner.cleanup()


def parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def kinds(spans: list[ReadableSpan], kind: SpanKind) -> list[ReadableSpan]:
    return [span for span in spans if span.kind is kind]


def names_as_parent(traceparent: str, span: ReadableSpan) -> bool:
    """The header continues `span`'s trace with `span` as the parent, sampled (the flags'
    other bits, such as W3C level 2's "random trace id", are the SDK's business)."""
    version, trace_id, parent, flags = traceparent.split("-")
    return (
        version == "00"
        and trace_id == format_trace_id(span.context.trace_id)
        and parent == format_span_id(span.context.span_id)
        and int(flags, 16) & 1 == 1
    )


async def test_one_trace_spans_agent_gateway_and_tool(
    traced: Traced, tool: Tool, gateway_factory: GatewayFactory
) -> None:
    """The agent's span is the parent of the gateway's server span; the tool's span is a
    child of the gateway's upstream call; all of them in the agent's trace."""
    gateway = await gateway_factory(tool.url)
    agent = traced.provider.get_tracer("agent")
    with agent.start_as_current_span("agent: file a ticket") as agent_span:
        headers: dict[str, str] = {}
        propagate.inject(headers)
        response = await gateway.post(
            "/tickets/v1/issues", key="run-1:0:c1", json_body=BODY, headers=headers
        )
    assert response.status == 201
    trace_id = agent_span.get_span_context().trace_id

    server = traced.one("POST /tickets")
    upstream_call = traced.one("POST")
    tool_span = traced.one("tool: create ticket")
    assert server.kind is SpanKind.SERVER
    assert upstream_call.kind is SpanKind.CLIENT
    assert {span.context.trace_id for span in traced.spans} == {trace_id}
    assert parent_id(server) == agent_span.get_span_context().span_id
    assert parent_id(upstream_call) == server.context.span_id
    assert parent_id(tool_span) == upstream_call.context.span_id
    for name in ("idempotency.claim", "idempotency.record"):
        assert parent_id(traced.one(name)) == server.context.span_id
    # On the wire: one traceparent, the gateway's hop, not the agent's copy beside it.
    assert names_as_parent(tool.headers[0]["traceparent"], upstream_call)


async def test_the_steps_carry_the_operation_route_state_and_attempt(
    traced: Traced, tool: Tool, gateway_factory: GatewayFactory
) -> None:
    gateway = await gateway_factory(tool.url)
    response = await gateway.post(
        "/tickets/v1/issues?api_key=query-secret", key="run-2:0:c1", json_body=BODY
    )
    assert response.status == 201
    operation = await (await gateway.get("/operations/run-2:0:c1")).json()

    claim = traced.one("idempotency.claim").attributes or {}
    upstream_call = traced.one("POST").attributes or {}
    record = traced.one("idempotency.record").attributes or {}
    server = traced.one("POST /tickets").attributes or {}
    for attributes in (claim, upstream_call, record, server):
        assert attributes[attr.OPERATION_ID] == operation["id"]
        assert attributes[attr.ROUTE] == "tickets"
        assert attributes[attr.ATTEMPT] == 1
    assert claim[attr.STATE] == "in_flight"
    assert (record[attr.WRITE], record[attr.STATE]) == ("complete", "completed")
    assert upstream_call[attr.HTTP_REQUEST_METHOD] == "POST"
    assert upstream_call[attr.HTTP_RESPONSE_STATUS_CODE] == 201
    assert upstream_call[attr.URL_FULL] == f"{tool.url}/v1/issues"  # no query string
    assert upstream_call[attr.SERVER_ADDRESS] == "127.0.0.1"
    assert server[attr.OUTCOME] == "forwarded"
    assert server[attr.STATE] == "completed"
    assert server[attr.KEY] == "run-2:0:c1"
    assert server[attr.HTTP_ROUTE] == "/tickets"
    assert server[attr.URL_PATH] == "/tickets/v1/issues"
    assert server[attr.HTTP_RESPONSE_STATUS_CODE] == 201
    assert len(str(server[attr.SCOPE])) == 12  # a short hash, as in the request log
    # No parent was sent: the gateway's server span starts the trace.
    assert traced.one("POST /tickets").parent is None


def test_attribute_names_are_the_semantic_conventions() -> None:
    """The names spelled in gateway.telemetry.attributes are OpenTelemetry's own."""
    assert attr.HTTP_REQUEST_METHOD == http_attributes.HTTP_REQUEST_METHOD
    assert attr.HTTP_REQUEST_METHOD_ORIGINAL == http_attributes.HTTP_REQUEST_METHOD_ORIGINAL
    assert attr.HTTP_RESPONSE_STATUS_CODE == http_attributes.HTTP_RESPONSE_STATUS_CODE
    assert attr.HTTP_ROUTE == http_attributes.HTTP_ROUTE
    assert attr.URL_FULL == url_attributes.URL_FULL
    assert attr.URL_PATH == url_attributes.URL_PATH
    assert attr.URL_SCHEME == url_attributes.URL_SCHEME
    assert attr.SERVER_ADDRESS == server_attributes.SERVER_ADDRESS
    assert attr.SERVER_PORT == server_attributes.SERVER_PORT
    assert attr.ERROR_TYPE == error_attributes.ERROR_TYPE


async def test_a_replay_has_a_request_span_and_no_upstream_call(
    traced: Traced, tool: Tool, gateway_factory: GatewayFactory
) -> None:
    gateway = await gateway_factory(tool.url)
    first = await gateway.post("/tickets/v1/issues", key="run-3:0:c1", json_body=BODY)
    assert first.status == 201
    operation_id = traced.one("POST /tickets").attributes[attr.OPERATION_ID]  # type: ignore[index]
    traced.exporter.clear()

    again = await gateway.post("/tickets/v1/issues", key="run-3:0:c1", json_body=BODY)
    assert again.headers["Idempotent-Replayed"] == "true"
    server = traced.one("POST /tickets")
    assert server.attributes is not None
    assert server.attributes[attr.OUTCOME] == "replayed"
    assert server.attributes[attr.STATE] == "completed"
    assert server.attributes[attr.OPERATION_ID] == operation_id
    assert server.attributes[attr.ATTEMPT] == 1
    assert kinds(traced.spans, SpanKind.CLIENT) == []
    assert traced.named("idempotency.record") == []
    assert len(tool.headers) == 1


async def test_a_timeout_is_recorded_as_unknown(
    traced: Traced, upstream: CountingUpstream, gateway_factory: GatewayFactory
) -> None:
    gateway = await gateway_factory(upstream.url, route={"timeout": "300ms"})
    response = await gateway.post("/tickets/v1/issues?delay=2", key="run-4:0:c1", json_body=BODY)
    assert (response.status, response.headers["Idempotency-Status"]) == (504, "unknown")

    upstream_call = traced.one("POST")
    assert upstream_call.status.status_code is StatusCode.ERROR
    assert (upstream_call.attributes or {})[attr.ERROR_TYPE] == "upstream-timeout"
    record = traced.one("idempotency.record").attributes or {}
    assert (record[attr.WRITE], record[attr.STATE]) == ("mark_unknown", "unknown")
    server = traced.one("POST /tickets")
    assert server.status.status_code is StatusCode.ERROR
    assert server.attributes is not None
    assert server.attributes[attr.STATE] == "unknown"
    assert server.attributes[attr.OUTCOME] == "unknown"
    assert server.attributes[attr.UNKNOWN_REASON] == "upstream-timeout"
    assert server.attributes[attr.HTTP_RESPONSE_STATUS_CODE] == 504


async def test_a_probe_has_its_span_and_carries_the_trace_upstream(
    traced: Traced, upstream: CountingUpstream, gateway_factory: GatewayFactory
) -> None:
    """A lookup of an unknown operation probes the upstream: the probe span is a child of
    the lookup's span, says what the probe found, and names itself in `traceparent`."""
    gateway = await gateway_factory(
        upstream.url, route={"forward_key": "operation_id", "probe": PROBE}
    )
    upstream.script[:] = [{"drop": "after_effect"}]
    response = await gateway.post("/tickets/v1/issues", key="run-5:0:c1", json_body=BODY)
    assert response.headers["Idempotency-Status"] == "unknown"
    traced.exporter.clear()

    lookup = await gateway.get("/operations/run-5:0:c1")
    assert (await lookup.json())["state"] == "completed"
    probe = traced.one("idempotency.probe")
    server = traced.one("GET")  # the lookup: not a route, so no route in its name
    assert probe.kind is SpanKind.CLIENT
    assert parent_id(probe) == server.context.span_id
    attributes = probe.attributes or {}
    assert attributes[attr.OPERATION_ID] == upstream.effects[0].key
    assert attributes[attr.ATTEMPT] == 1
    assert attributes[attr.STATE] == "completed"
    assert attributes[attr.PROBE_RESULT] == "applied"
    assert attributes[attr.RESOLVED_BY] == "probe"
    assert attributes[attr.HTTP_RESPONSE_STATUS_CODE] == 200
    assert attributes[attr.URL_TEMPLATE] == "/effects/{operation_id}"
    assert names_as_parent(upstream.probes[-1]["traceparent"], probe)


async def test_mcp_tool_calls_go_through_the_same_steps(
    traced: Traced, gateway_factory: GatewayFactory
) -> None:
    async with CountingMcpServer() as server:
        route = {"name": "tools", "prefix": "/tools", "upstream": server.url, "kind": "mcp"}
        gateway = await gateway_factory(server.url, route=route)
        agent = traced.provider.get_tracer("agent")
        with agent.start_as_current_span("agent: call a tool") as agent_span:
            headers: dict[str, str] = {}
            propagate.inject(headers)
            async with (
                asyncio.timeout(60),
                mcp_client(f"{gateway.url}/tools", headers=headers) as mcp,
            ):
                result = await call_with_key(mcp, "create_ticket", {"title": "x"}, "mcp-1:0:c1")
        assert result.is_error is False
        effect = server.effects[0]

    call_spans = [
        span
        for span in traced.spans
        if (span.attributes or {}).get(attr.OPERATION_ID) == effect.meta.get("idempotencyKey")
    ]
    names = sorted(span.name for span in call_spans)
    assert names == ["POST", "POST /tools", "idempotency.claim", "idempotency.record"], names
    server_span = next(span for span in call_spans if span.kind is SpanKind.SERVER)
    upstream_call = next(span for span in call_spans if span.kind is SpanKind.CLIENT)
    assert parent_id(server_span) == agent_span.get_span_context().span_id
    assert (server_span.attributes or {})[attr.OUTCOME] == "forwarded"
    assert (server_span.attributes or {})[attr.STATE] == "completed"
    assert upstream_call.context.trace_id == agent_span.get_span_context().trace_id
    assert names_as_parent(effect.headers["traceparent"], upstream_call)


async def test_no_span_records_a_body_a_credential_or_a_query(
    traced: Traced, upstream: CountingUpstream, gateway_factory: GatewayFactory
) -> None:
    """Every attribute, event, name and status of every span, through a miss, a replay,
    a timeout and a pass-through, holds none of the secrets the requests carried."""
    secrets = {
        "caller credential": "caller-secret-7c1d",
        "tool API credential": "upstream-secret-9e2f",
        "body": "body-secret-4111111111111111",
        "query": "query-secret-5a6b",
        "cookie": "cookie-secret-3d4e",
    }
    route = {
        "timeout": "300ms",
        "upstream_headers": {"X-Api-Key": "Bearer " + secrets["tool API credential"]},
    }
    gateway = await gateway_factory(upstream.url, route=route, idempotency={"shared_scope": False})
    headers = {
        "Authorization": "Bearer " + secrets["caller credential"],
        "Cookie": "session=" + secrets["cookie"],
    }
    path = f"/tickets/v1/issues?api_key={secrets['query']}"
    for key, query in (("run-6:0:c1", ""), ("run-6:0:c1", ""), ("run-6:0:c2", "&delay=2")):
        await gateway.post(path + query, key=key, json_body=BODY, headers=headers)
    await gateway.get(path, headers=headers)
    assert secrets["tool API credential"] in upstream.effects[0].headers["x-api-key"]
    assert secrets["body"] in upstream.effects[0].body.decode()

    recorded = []
    for span in traced.spans:
        recorded.append(span.name)
        recorded.append(span.status.description or "")
        recorded.extend(f"{name}={value}" for name, value in (span.attributes or {}).items())
        for event in span.events:
            recorded.append(event.name)
            recorded.extend(f"{name}={value}" for name, value in (event.attributes or {}).items())
    assert len(traced.spans) >= 10
    text = "\n".join(recorded)
    for what, secret in secrets.items():
        assert secret not in text, what


async def test_tracing_off_changes_nothing_on_the_wire(
    upstream: CountingUpstream, gateway_factory: GatewayFactory
) -> None:
    """No provider handed in, none global, no OTEL_* variable: no middleware, no tracer, and
    a caller's trace headers pass through as they always have (none when it sent none)."""
    gateway = await gateway_factory(upstream.url)
    assert gateway.app[TRACER] is NO_TRACER
    assert server_span_middleware not in gateway.app.middlewares
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    sent = {"traceparent": traceparent, "tracestate": "vendor=opaque"}
    await gateway.post("/tickets/v1/issues", key="off-1", json_body=BODY, headers=sent)
    await gateway.post("/tickets/v1/issues", key="off-2", json_body=BODY)
    first, second = upstream.effects
    assert (first.headers["traceparent"], first.headers["tracestate"]) == (
        traceparent,
        "vendor=opaque",
    )
    assert "traceparent" not in second.headers
    assert "tracestate" not in second.headers


async def test_the_callers_tracestate_is_continued_and_its_traceparent_replaced(
    traced: Traced, upstream: CountingUpstream, gateway_factory: GatewayFactory
) -> None:
    gateway = await gateway_factory(upstream.url)
    sent = {
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "tracestate": "vendor=opaque",
    }
    await gateway.post("/tickets/v1/issues", key="ts-1", json_body=BODY, headers=sent)
    upstream_call = traced.one("POST")
    assert format_trace_id(upstream_call.context.trace_id) == "0af7651916cd43dd8448eb211c80319c"
    seen = upstream.effects[0].headers
    assert names_as_parent(seen["traceparent"], upstream_call)
    assert seen["tracestate"] == "vendor=opaque"


NO_OTEL_SITE = """
import sys


class NoOpenTelemetry:
    \"\"\"Makes this interpreter one without the otel extra: no `opentelemetry` anywhere.\"\"\"

    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, NoOpenTelemetry())
"""


async def test_without_the_otel_extra_the_gateway_serves_as_before(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """`python -m gateway serve` where `opentelemetry` cannot be imported, though OTEL_*
    asks for traces: it starts, says why it does not trace, and forwards as it always has."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(NO_OTEL_SITE)
    gateway = spawn(
        processes,
        tmp_path,
        upstream.url,
        env={"PYTHONPATH": str(site), "OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT},
    )
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    headers = {"Idempotency-Key": "no-otel-1", "traceparent": traceparent}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{gateway.url}/tickets/v1/issues", data=b"{}", headers=headers) as response,
    ):
        assert response.status == 201
    assert upstream.effects[0].headers["traceparent"] == traceparent
    assert gateway.log_path is not None
    assert "the otel extra is not installed" in gateway.log_path.read_text()


async def test_otel_sdk_disabled_turns_tracing_off(
    traced: Traced,
    upstream: CountingUpstream,
    gateway_factory: GatewayFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    gateway = await gateway_factory(upstream.url)
    await gateway.post("/tickets/v1/issues", key="dis-1", json_body=BODY)
    assert gateway.app[TRACER] is NO_TRACER
    assert traced.spans == []


@pytest.mark.parametrize(
    ("variables", "on"),
    [
        ({}, False),
        ({"OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT}, False),
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, False),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": ENDPOINT + "/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "TRUE"}, False),
    ],
)
def test_the_environment_decides_whether_tracing_is_on(
    variables: dict[str, str], on: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert wanted() is on
    choice = choose()
    assert (choice is not None) is on
    if choice is not None:
        assert choice.shutdown is not None  # built here: the gateway's to shut down
        choice.shutdown()


async def test_a_subprocess_configured_by_otel_variables_exports_otlp(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """`python -m gateway serve` with only OTEL_* variables set: its spans arrive at an
    OTLP/HTTP receiver (protobuf POSTs to /v1/traces), in the caller's trace."""
    requests: list[ExportTraceServiceRequest] = []
    arrived = asyncio.Event()

    async def receive(request: web.Request) -> web.Response:
        body = await request.read()
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        requests.append(ExportTraceServiceRequest.FromString(body))
        arrived.set()
        return web.Response(body=b"", content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", receive)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    try:
        gateway = spawn(
            processes,
            tmp_path,
            upstream.url,
            env={
                "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{host}:{port}",
                "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment.name=test",
                "OTEL_BSP_SCHEDULE_DELAY": "50",
                "NO_PROXY": "127.0.0.1,localhost",
                "no_proxy": "127.0.0.1,localhost",
            },
        )
        trace_id, agent_span_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
        headers = {
            "Idempotency-Key": "otlp-1",
            "Content-Type": "application/json",
            "traceparent": f"00-{trace_id}-{agent_span_id}-01",
        }
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                f"{gateway.url}/tickets/v1/issues", data=json.dumps(BODY).encode(), headers=headers
            ) as response,
        ):
            assert response.status == 201
        spans = await _spans_until(requests, arrived, {"POST /tickets", "idempotency.record"})
    finally:
        for process in processes:
            process.stop()
        await runner.cleanup()

    resource = {
        item.key: item.value.string_value
        for item in requests[0].resource_spans[0].resource.attributes
    }
    assert resource["service.name"] == "idempotency-gateway"
    assert resource["deployment.environment.name"] == "test"
    server = spans["POST /tickets"]
    assert server.trace_id.hex() == trace_id
    assert server.parent_span_id.hex() == agent_span_id
    assert {"idempotency.claim", "POST", "idempotency.record"} <= set(spans)
    _, seen_trace_id, seen_parent, _ = upstream.effects[0].headers["traceparent"].split("-")
    assert (seen_trace_id, seen_parent) == (trace_id, spans["POST"].span_id.hex())


async def _spans_until(
    requests: list[ExportTraceServiceRequest], arrived: asyncio.Event, names: set[str]
) -> dict[str, Any]:
    """The spans received so far by name, once all of `names` are among them (60 s at most)."""
    async with asyncio.timeout(60):
        while True:
            spans = {
                span.name: span
                for request in requests
                for resource in request.resource_spans
                for scope in resource.scope_spans
                for span in scope.spans
            }
            if names <= set(spans):
                return spans
            arrived.clear()
            await arrived.wait()
