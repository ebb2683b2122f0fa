"""A counting MCP server: the MCP upstream that gateway tests put behind the gateway.

Like ``upstream.CountingUpstream`` for plain HTTP tool APIs, but an MCP server
built on the official ``mcp`` SDK (``MCPServer``) and served over the
Streamable HTTP transport by uvicorn, in-process, on 127.0.0.1 and a port the
OS chooses. The gateway's promise is "at most one effect per key", so every
side-effecting tool call is recorded as an ``McpEffect``: the tool, its
arguments, the ``_meta`` the call carried (``_meta.idempotencyKey`` included)
and the HTTP headers of the POST that carried it (``Idempotency-Key``,
``Mcp-Session-Id``, ``MCP-Protocol-Version``...).

Tools (each records an effect unless said otherwise):

- ``create_ticket(title)``: answers ``{"id": "T-<n>", "title": ...}`` as
  structured content;
- ``slow_ticket(title, seconds)``: applies the effect, sends a progress
  notification (when the caller asked for progress), then waits ``seconds``
  before answering (an API that has done the work but answers late);
- ``notify_then_ticket(title, seconds)``: sends a progress notification
  first, waits ``seconds``, then applies the effect and answers;
- ``lose_connection(title)``: applies the effect, then the HTTP connection that
  would carry the answer is closed before the JSON-RPC response is written
  (sent, applied, no answer: the ambiguous case). When the answer is an SSE
  stream, its headers (and any notification) have gone out and the stream ends
  early; when it is JSON (``json_response=True``, or a 2026-era call that sent
  no notification), not one byte of the answer has;
- ``failing_tool()``: applies an effect, then answers a tool result with
  ``isError: true`` (the tool's own failure: a normal, final answer);
- ``lookup_ticket(id)``: read-only (``readOnlyHint: true``), no effect; an
  unknown id is a tool error (``isError: true``);
- ``send_email(to, subject)``: a second kind of effect, ``{"id": "E-<n>", ...}``;
- ``chatty_ticket(title, notes, note_size)``: creates a ticket, then sends ``notes``
  progress notifications of ``note_size`` characters each before answering;
- ``large_ticket(title, size)``: creates a ticket whose title is padded to ``size``
  characters (a large answer);
- ``until_cancelled(title)``: no effect; reports progress, then works until the server
  cancels the call, which ``cancelled`` records.

Transport modes, as the SDK's ``streamable_http_app`` offers them:

- session-based (default): ``initialize`` answers with ``Mcp-Session-Id``,
  later requests must carry it, ``GET`` opens the server's stream, ``DELETE``
  ends the session;
- ``stateless=True``: no session id; every POST stands alone;
- ``json_response=True``: a POST carrying a request is answered with
  ``application/json`` instead of ``text/event-stream`` (and progress
  notifications are dropped by the SDK: JSON has no room for them).

Whatever the mode, a request whose ``MCP-Protocol-Version`` header names a
2026-07-28-era version (what the SDK's default ``Client(mode="auto")`` ends up
speaking with an SDK 2.x server) is served by the SDK's per-request path: no
``initialize``, no session, one POST in, one answer out.

``mcp_client`` opens an official-SDK client on any URL (this server's or a
gateway's) and ``call_with_key`` calls a tool with ``_meta.idempotencyKey`` set.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Self, cast

import httpx2
import uvicorn
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from typing_extensions import TypedDict  # what pydantic wants on 3.11

if TYPE_CHECKING:
    from types import TracebackType

    from mcp.client.client import ConnectMode
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
    from mcp.shared.dispatcher import ProgressFnT
    from mcp.types import RequestParamsMeta
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "ACCEPT_BOTH",
    "INITIALIZE",
    "LEGACY",
    "MODERN",
    "CountingMcpServer",
    "HttpExchange",
    "McpCall",
    "McpEffect",
    "ProgressLog",
    "call_with_key",
    "example_mcp_server",
    "mcp_client",
]

HOST = "127.0.0.1"
PATH = "/mcp"

INITIALIZE: Final = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"},
    },
}
"""A raw client's ``initialize`` (protocol 2025-11-25), for tests that speak HTTP themselves."""

ACCEPT_BOTH: Final = {"Accept": "application/json, text/event-stream"}
"""What a Streamable HTTP client must accept on every POST."""

LEGACY: Final = "legacy"
"""``mcp_client`` mode: the ``initialize`` handshake (protocol 2025-11-25, sessions)."""

MODERN: Final = "2026-07-28"
"""``mcp_client`` mode: the per-request 2026-07-28 protocol (no handshake, no session)."""

IDEMPOTENCY_KEY_META: Final = "idempotencyKey"
"""The ``_meta`` member that carries a call's idempotency key."""


class Ticket(TypedDict):
    id: str
    title: str


class Email(TypedDict):
    id: str
    to: str
    subject: str


@dataclass(frozen=True, kw_only=True)
class McpCall:
    """One ``tools/call`` that reached a tool, as the server saw it.

    ``meta`` is the call's ``_meta`` exactly as sent (wire spelling, e.g.
    ``progressToken``); ``headers`` are the HTTP headers of the POST that
    carried the call, names lower-cased, repeated headers joined with ``", "``.
    """

    tool: str
    arguments: dict[str, Any]
    meta: dict[str, Any]
    headers: dict[str, str]
    request_id: str

    @property
    def key(self) -> str | None:
        """``_meta.idempotencyKey``, when the call carried a string there."""
        value = self.meta.get(IDEMPOTENCY_KEY_META)
        return value if isinstance(value, str) else None

    @property
    def session_id(self) -> str | None:
        """The ``Mcp-Session-Id`` header of the POST (None when stateless or 2026-era)."""
        return self.headers.get("mcp-session-id")

    @property
    def protocol_version(self) -> str | None:
        """The ``MCP-Protocol-Version`` header of the POST."""
        return self.headers.get("mcp-protocol-version")


@dataclass(frozen=True, kw_only=True)
class McpEffect(McpCall):
    """One applied effect; ``number`` counts from 1 in the order they were applied."""

    number: int


@dataclass(kw_only=True)
class HttpExchange:
    """One HTTP request that reached the MCP endpoint (any method), and how it was answered.

    Header names are lower-cased. ``status`` and ``response_headers`` are filled in
    when the answer starts (None until then); ``cut`` is true when the server closed
    the connection instead of answering (``lose_connection``).
    """

    method: str
    headers: dict[str, str]
    body: bytes
    status: int | None = None
    response_headers: dict[str, str] | None = None
    cut: bool = False

    @property
    def content_type(self) -> str | None:
        """The answer's ``Content-Type``, once it started."""
        return (self.response_headers or {}).get("content-type")

    @property
    def json(self) -> Any:
        """The request body parsed as JSON, or None when there is none."""
        return json.loads(self.body) if self.body else None


class CountingMcpServer:
    """An MCP server on 127.0.0.1 that records every effect its tools apply.

    >>> async with CountingMcpServer() as server:
    ...     async with mcp_client(server.url) as client:
    ...         await call_with_key(client, "create_ticket", {"title": "x"}, "k1")
    ...     assert server.count_for("k1") == 1
    """

    def __init__(
        self,
        *,
        stateless: bool = False,
        json_response: bool = False,
        shutdown_timeout: int = 1,
    ) -> None:
        self.stateless = stateless
        self.json_response = json_response
        self._shutdown_timeout = shutdown_timeout
        self.effects: list[McpEffect] = []
        self.calls_seen: list[McpCall] = []
        """Every ``tools/call`` that reached a tool, effect or not, in arrival order."""
        self.requests: list[HttpExchange] = []
        """Every HTTP request to the MCP endpoint (POST, GET, DELETE...), in arrival order."""
        self.tickets: list[Ticket] = []
        """Every ticket created, in order (``lookup_ticket`` reads them)."""
        self.emails: list[Email] = []
        """Every email sent, in order."""
        self.cancelled: list[str] = []
        """The titles of ``until_cancelled`` calls the server cancelled, in order."""
        self.spared = 0
        """How many of the next ``lose_connection`` calls are answered, not cut (a call of
        that tool that completed: what a probe is calibrated against)."""
        self._changed = asyncio.Event()
        self._serving: _Serving | None = None
        self._url: str | None = None

    @property
    def url(self) -> str:
        """The MCP endpoint, e.g. ``http://127.0.0.1:41234/mcp``."""
        if self._url is None:
            raise RuntimeError("CountingMcpServer is not started")
        return self._url

    @property
    def count(self) -> int:
        """How many effects were applied since the start (or the last reset)."""
        return len(self.effects)

    def count_for(self, idempotency_key: str) -> int:
        """How many effects came from calls whose ``_meta.idempotencyKey`` was this key."""
        return sum(1 for effect in self.effects if effect.key == idempotency_key)

    def reset(self) -> None:
        """Forget recorded effects, calls and requests (the server keeps running; tickets
        and emails stay, so their numbering goes on)."""
        self.effects.clear()
        self.calls_seen.clear()
        self.requests.clear()

    async def wait_for_count(self, count: int, *, seconds: float = 2.0) -> None:
        """Wait until at least ``count`` effects were applied; TimeoutError after ``seconds``."""
        async with asyncio.timeout(seconds):
            while self.count < count:
                self._changed.clear()
                await self._changed.wait()

    async def wait_for_request(self, method: str, *, seconds: float = 2.0) -> HttpExchange:
        """The first HTTP request with this method (e.g. ``"GET"``), waiting for it to
        arrive if need be; TimeoutError after ``seconds``."""
        async with asyncio.timeout(seconds):
            while True:
                for exchange in self.requests:
                    if exchange.method == method:
                        return exchange
                self._changed.clear()
                await self._changed.wait()

    async def start(self) -> None:
        """Listen on 127.0.0.1 on a port the OS chooses; return once requests are served."""
        if self._serving is not None:
            raise RuntimeError("CountingMcpServer is already started")
        mcp = self._build()
        sdk_app = mcp.streamable_http_app(
            streamable_http_path=PATH,
            json_response=self.json_response,
            stateless_http=self.stateless,
            host=HOST,
        )
        # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on accepted connections only for a
        # socket that says it is TCP; without it every keep-alive answer waits ~40 ms for
        # the client's delayed ACK.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            sock.bind((HOST, 0))
            port = sock.getsockname()[1]
            serving = _Serving(
                _Wire(sdk_app, self._arrived, self._spare),
                mcp.session_manager,
                self._shutdown_timeout,
            )
            await serving.start(sock)
        except BaseException:
            sock.close()
            raise
        self._serving = serving
        self._url = f"http://{HOST}:{port}{PATH}"

    async def stop(self) -> None:
        """Stop serving, ending open sessions and their streams; safe to call twice.

        Requests still open after that (a 2026-era call in progress) get
        ``shutdown_timeout`` seconds before they are cancelled.
        """
        serving, self._serving = self._serving, None
        if serving is not None:
            await serving.stop()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def __repr__(self) -> str:
        return f"<CountingMcpServer url={self._url!r} count={self.count}>"

    # -- the tools ---------------------------------------------------------------

    def _build(self) -> MCPServer:
        # WARNING: MCPServer calls logging.basicConfig, a no-op once logging is set up.
        mcp = MCPServer("counting-mcp-upstream", log_level="WARNING")
        effects: list[tuple[str, Callable[..., Awaitable[object]]]] = [
            ("create_ticket", self._create_ticket),
            ("slow_ticket", self._slow_ticket),
            ("notify_then_ticket", self._notify_then_ticket),
            ("lose_connection", self._lose_connection),
            ("send_email", self._send_email),
            ("chatty_ticket", self._chatty_ticket),
            ("large_ticket", self._large_ticket),
        ]
        for name, tool in effects:
            mcp.add_tool(tool, name=name, structured_output=True)
        mcp.add_tool(self._failing_tool, name="failing_tool")
        mcp.add_tool(self._until_cancelled, name="until_cancelled")
        mcp.add_tool(
            self._lookup_ticket,
            name="lookup_ticket",
            annotations=ToolAnnotations(read_only_hint=True),
            structured_output=True,
        )
        return mcp

    async def _create_ticket(self, title: str, ctx: Context) -> Ticket:
        """Create a ticket (an effect)."""
        self._seen(ctx)
        return self._new_ticket(title, ctx)

    async def _slow_ticket(self, title: str, seconds: float, ctx: Context) -> Ticket:
        """Create a ticket, report progress, then take `seconds` to answer."""
        self._seen(ctx)
        ticket = self._new_ticket(title, ctx)
        await ctx.report_progress(1, 1, f"created {ticket['id']}")
        await asyncio.sleep(seconds)
        return ticket

    async def _notify_then_ticket(self, title: str, seconds: float, ctx: Context) -> Ticket:
        """Report progress, wait `seconds`, then create a ticket and answer."""
        self._seen(ctx)
        await ctx.report_progress(0, 1, "working")
        await asyncio.sleep(seconds)
        return self._new_ticket(title, ctx)

    async def _chatty_ticket(self, title: str, notes: int, note_size: int, ctx: Context) -> Ticket:
        """Create a ticket, then report progress `notes` times, each with a message of
        `note_size` characters (when the caller asked for progress), then answer."""
        self._seen(ctx)
        ticket = self._new_ticket(title, ctx)
        for done in range(notes):
            await ctx.report_progress(done, notes, "n" * note_size)
        return ticket

    async def _large_ticket(self, title: str, size: int, ctx: Context) -> Ticket:
        """Create a ticket whose title is padded to `size` characters: a large answer."""
        self._seen(ctx)
        return self._new_ticket(title.ljust(size, "x"), ctx)

    async def _lose_connection(self, title: str, ctx: Context) -> Ticket:
        """Create a ticket; the connection is then cut before the answer is written."""
        self._seen(ctx)
        return self._new_ticket(title, ctx)

    async def _until_cancelled(self, title: str, ctx: Context) -> str:
        """Report progress, then work until the server cancels the call (no effect); the
        cancellation is recorded in ``cancelled``."""
        self._seen(ctx)
        await ctx.report_progress(0, 1, "started")
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.append(title)
            self._changed.set()
            raise
        return title  # never reached

    async def wait_for_cancelled(self, title: str, *, seconds: float) -> None:
        """Wait until the server cancelled the ``until_cancelled`` call named ``title``."""
        async with asyncio.timeout(seconds):
            while title not in self.cancelled:
                self._changed.clear()
                await self._changed.wait()

    async def _failing_tool(self, ctx: Context) -> CallToolResult:
        """Apply an effect, then fail as a tool (a result with isError: true)."""
        self._seen(ctx)
        self._record(ctx)
        return CallToolResult(
            content=[TextContent(type="text", text="the ticket system refused the request")],
            is_error=True,
        )

    async def _lookup_ticket(self, id: str, ctx: Context) -> Ticket:
        """Read a ticket created by an earlier call (read-only, no effect)."""
        self._seen(ctx)
        for ticket in self.tickets:
            if ticket["id"] == id:
                return ticket
        raise ToolError(f"no ticket {id!r}")

    async def _send_email(self, to: str, subject: str, ctx: Context) -> Email:
        """Send an email (an effect of a second kind)."""
        self._seen(ctx)
        self._record(ctx)
        email = Email(id=f"E-{len(self.emails) + 1}", to=to, subject=subject)
        self.emails.append(email)
        return email

    def _new_ticket(self, title: str, ctx: Context) -> Ticket:
        self._record(ctx)
        ticket = Ticket(id=f"T-{len(self.tickets) + 1}", title=title)
        self.tickets.append(ticket)
        return ticket

    def _arrived(self, exchange: HttpExchange) -> None:
        self.requests.append(exchange)
        self._changed.set()

    def _spare(self) -> bool:
        if self.spared <= 0:
            return False
        self.spared -= 1
        return True

    def _seen(self, ctx: Context) -> None:
        self.calls_seen.append(McpCall(**_describe(ctx)))

    def _record(self, ctx: Context) -> McpEffect:
        effect = McpEffect(number=len(self.effects) + 1, **_describe(ctx))
        self.effects.append(effect)
        self._changed.set()
        return effect


def _describe(ctx: Context) -> dict[str, Any]:
    """The fields of an ``McpCall`` for the ``tools/call`` `ctx` belongs to."""
    params: Mapping[str, Any] = ctx.request_context.params or {}
    meta = params.get("_meta")
    arguments = params.get("arguments")
    headers: dict[str, str] = {}
    for name, value in (ctx.headers or {}).items():
        lowered = name.lower()
        headers[lowered] = f"{headers[lowered]}, {value}" if lowered in headers else value
    return {
        "tool": str(params.get("name")),
        "arguments": json.loads(json.dumps(arguments)) if isinstance(arguments, dict) else {},
        "meta": json.loads(json.dumps(meta)) if isinstance(meta, dict) else {},
        "headers": headers,
        "request_id": ctx.request_id,
    }


class _QuietServer(uvicorn.Server):
    """uvicorn without its signal handlers: the test process keeps its own."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class _Serving:
    """uvicorn serving an SDK app in this event loop, with the SDK's session manager run
    here rather than in the app's lifespan, so that ``stop`` can end the sessions (and
    with them the SSE streams that would hold uvicorn's shutdown) before waiting."""

    def __init__(
        self, app: ASGIApp, sessions: StreamableHTTPSessionManager, shutdown_timeout: int
    ) -> None:
        config = uvicorn.Config(
            app,
            http="h11",  # _Cutter closes the h11 cycle's transport
            ws="none",
            lifespan="off",  # the app's lifespan only runs the session manager: see below
            log_config=None,
            access_log=False,
            proxy_headers=False,
            timeout_graceful_shutdown=shutdown_timeout,
        )
        self._server = _QuietServer(config)
        self._sessions = sessions
        self._sessions_up = asyncio.Event()
        self._sessions_end = asyncio.Event()
        self._sessions_task: asyncio.Task[None] | None = None
        self._serve_task: asyncio.Task[None] | None = None

    async def start(self, sock: socket.socket) -> None:
        self._sessions_task = asyncio.create_task(self._run_sessions())
        try:
            async with asyncio.timeout(10):
                up = asyncio.create_task(self._sessions_up.wait())
                await asyncio.wait({up, self._sessions_task}, return_when=asyncio.FIRST_COMPLETED)
                up.cancel()
                if self._sessions_task.done():
                    await self._sessions_task  # raises what stopped it
                    raise RuntimeError("the SDK's session manager stopped during startup")
                self._serve_task = asyncio.create_task(self._server.serve(sockets=[sock]))
                while not self._server.started:
                    if self._serve_task.done():
                        await self._serve_task  # raises what stopped it
                        raise RuntimeError("uvicorn stopped during startup")
                    await asyncio.sleep(0.005)
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        self._server.should_exit = True
        if self._server.started:
            # Stop listening now rather than on uvicorn's next tick: no request can
            # arrive once the session manager below is gone.
            for listener in self._server.servers:
                listener.close()
        self._sessions_end.set()
        if self._sessions_task is not None:
            await self._sessions_task  # every session ends, and so do their streams
        if self._serve_task is not None:
            async with asyncio.timeout((self._server.config.timeout_graceful_shutdown or 0) + 5):
                await self._serve_task

    async def _run_sessions(self) -> None:
        # Entered and left in this one task, as anyio's task group requires.
        async with self._sessions.run():
            self._sessions_up.set()
            await self._sessions_end.wait()


class _Wire:
    """Raw ASGI middleware in front of the SDK app: records every request, and cuts the
    connection of a ``lose_connection`` call instead of letting its answer out."""

    def __init__(
        self,
        app: ASGIApp,
        arrived: Callable[[HttpExchange], None],
        spare: Callable[[], bool] = lambda: False,
    ) -> None:
        self._app = app
        self._arrived = arrived
        self._spare = spare

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        body = bytearray()
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # disconnected before the body was read
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
        exchange = HttpExchange(
            method=scope["method"],
            headers=_header_dict(scope["headers"]),
            body=bytes(body),
        )
        self._arrived(exchange)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        cut = _calls_tool(exchange.body, "lose_connection") and not self._spare()
        if scope["method"] == "POST" and cut:
            await self._app(scope, replay, _Cutter(send, exchange).send)
            if exchange.cut:
                await _wait_for_disconnect(receive)
            return

        async def recording_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                _started(exchange, message)
            await send(message)

        await self._app(scope, replay, recording_send)


class _Cutter:
    """The ``send`` of a ``lose_connection`` call: forwards an SSE stream's headers and
    notifications, and closes the connection where the JSON-RPC answer would go."""

    def __init__(self, send: Send, exchange: HttpExchange) -> None:
        self._send = send
        self._exchange = exchange
        self._forwarding = False

    async def send(self, message: Message) -> None:
        if self._exchange.cut:
            return
        if message["type"] == "http.response.start":
            _started(self._exchange, message)
            # An SSE answer's headers go out at once: the stream is open, its end is lost.
            # A JSON answer's headers are held back: its body is the JSON-RPC response.
            self._forwarding = (self._exchange.content_type or "").startswith("text/event-stream")
            if self._forwarding:
                await self._send(message)
            return
        if message["type"] != "http.response.body":
            await self._send(message)
            return
        if self._forwarding and not _carries_response(message.get("body", b"")):
            await self._send(message)
            return
        self._cut()

    def _cut(self) -> None:
        # uvicorn's h11 implementation hands the app its RequestResponseCycle.send; its
        # `transport` is the client's connection. ASGI itself has no way to hang up.
        transport = getattr(getattr(self._send, "__self__", None), "transport", None)
        if not isinstance(transport, asyncio.BaseTransport):
            raise RuntimeError("cannot reach the connection's transport (uvicorn with http='h11')")
        self._exchange.cut = True
        transport.close()


async def _wait_for_disconnect(receive: Receive) -> None:
    """Return once uvicorn has noticed the closed connection, so it does not answer 500."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(2):
            while (await receive())["type"] != "http.disconnect":
                pass


def _started(exchange: HttpExchange, message: Message) -> None:
    exchange.status = int(message["status"])
    exchange.response_headers = _header_dict(message.get("headers", []))


def _header_dict(raw: Any) -> dict[str, str]:
    headers: dict[str, str] = {}
    for name_bytes, value_bytes in raw:
        name = bytes(name_bytes).decode("latin-1").lower()
        value = bytes(value_bytes).decode("latin-1")
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return headers


def _calls_tool(body: bytes, tool: str) -> bool:
    try:
        message = json.loads(body)
    except ValueError:
        return False
    if not isinstance(message, dict) or message.get("method") != "tools/call":
        return False
    params = message.get("params")
    return isinstance(params, dict) and params.get("name") == tool


def _carries_response(chunk: bytes) -> bool:
    """Whether an SSE chunk holds a JSON-RPC response (an event with an id and a result/error)."""
    for line in chunk.decode("utf-8", "replace").splitlines():
        if not line.startswith("data:"):
            continue
        try:
            message = json.loads(line[5:])
        except ValueError:
            continue
        if (
            isinstance(message, dict)
            and "id" in message
            and ("result" in message or "error" in message)
        ):
            return True
    return False


# -- the client side -------------------------------------------------------------


@contextlib.asynccontextmanager
async def example_mcp_server(start_timeout: float = 30.0) -> AsyncIterator[str]:
    """examples/mcp_server.py as `make run` starts it, on a port the OS picks: its URL,
    for as long as the block runs (the process is ended after it, even on failure)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "examples.mcp_server",
        "--port",
        "0",
        cwd=Path(__file__).parents[1],
        stdout=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    try:
        async with asyncio.timeout(start_timeout):
            line = (await process.stdout.readline()).decode()
        assert "listening on" in line, line
        yield line.strip().rsplit(" ", 1)[-1]
    finally:
        process.terminate()
        await process.wait()


@contextlib.asynccontextmanager
async def mcp_client(
    url: str,
    *,
    headers: Mapping[str, str] | None = None,
    mode: ConnectMode = LEGACY,
    read_timeout: float = 60.0,
    terminate_on_close: bool = True,
) -> AsyncIterator[Client]:
    """An official-SDK MCP client on `url` (this server's, or a gateway's), connected.

    ``headers`` go on every HTTP request; ``read_timeout`` is httpx2's (seconds without
    a byte on a response, SSE streams included). ``mode`` is the SDK's: ``LEGACY`` (the
    default here) runs the ``initialize`` handshake and keeps a session,
    ``MODERN`` speaks 2026-07-28 per-request, ``"auto"`` (the SDK's own default)
    probes ``server/discover`` and falls back to ``initialize``. The SDK's response
    cache is off, so every call reaches the server.

    >>> async with mcp_client(server.url, headers={"Authorization": "Bearer t"}) as client:
    ...     result = await call_with_key(client, "create_ticket", {"title": "x"}, "k1")
    """
    timeout = httpx2.Timeout(10.0, read=read_timeout)
    async with (
        httpx2.AsyncClient(headers=dict(headers or {}), timeout=timeout) as http,
        Client(
            streamable_http_client(url, http_client=http, terminate_on_close=terminate_on_close),
            mode=mode,
            cache=None,
        ) as client,
    ):
        yield client


async def call_with_key(
    client: Client,
    tool: str,
    arguments: Mapping[str, Any] | None,
    key: str | None,
    *,
    progress: ProgressFnT | None = None,
    read_timeout: float | None = None,
    meta: Mapping[str, Any] | None = None,
) -> CallToolResult:
    """Call `tool` with ``_meta.idempotencyKey = key`` (omitted when `key` is None).

    ``meta`` adds other ``_meta`` members; ``progress`` makes the SDK send a
    ``progressToken`` (the JSON-RPC request id) and receive progress notifications;
    ``read_timeout`` is the SDK's read timeout for this call (it then raises
    ``MCPError`` -32001 and POSTs ``notifications/cancelled``).
    """
    call_meta: dict[str, Any] = dict(meta or {})
    if key is not None:
        call_meta[IDEMPOTENCY_KEY_META] = key
    return await client.call_tool(
        tool,
        dict(arguments or {}),
        read_timeout_seconds=read_timeout,
        progress_callback=progress,
        # RequestParamsMeta is an open TypedDict (extra_items=Any) that mypy reads as closed.
        meta=cast("RequestParamsMeta", call_meta) if call_meta else None,
    )


@dataclass
class ProgressLog:
    """A progress callback that records what arrived and when (``time.monotonic``).

    >>> log = ProgressLog()
    >>> await call_with_key(client, "slow_ticket", {...}, "k", progress=log)
    """

    events: list[tuple[float, float, float | None, str | None]] = field(default_factory=list)

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        self.events.append((time.monotonic(), progress, total, message))
