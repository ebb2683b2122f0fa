"""An example MCP server with side-effecting tools and no idempotency of its own.

This is the kind of MCP server the gateway's MCP routes exist for: every
``tools/call`` of ``create_ticket`` or ``send_email`` applies a new effect, a
retried call (an agent that timed out, a client that reconnected) creates a
second ticket or sends a second email, and nothing in the server can tell a
retry from a new call. ``list_tickets`` and ``find_ticket`` only read, and say
so with the ``readOnlyHint`` tool annotation. State lives in memory, so a
restart forgets everything; that is enough for demos and end-to-end tests.

One concession makes the demo legible: each ticket and email records the
``_meta.idempotencyKey`` its ``tools/call`` arrived with (what the gateway
forwards, or None when the call carried none), and ``list_tickets`` shows it.
The server does not dedupe on it: a retry is still a second ticket. But it
can be asked about it: ``find_ticket(idempotency_key)`` answers ``{"found":
..., "ticket": ...}``, which is what the gateway's MCP probe
(``config/gateway.toml``) calls to settle a ``create_ticket`` whose answer
was lost.

One switch makes it slow, as the example ticket API's ``?delay=``:
``create_ticket``'s optional ``delay_seconds`` argument waits that long,
then creates the ticket and answers (a tool that applies a call late, after
its caller gave up). Behind the gateway, a silence past the route's
``timeout`` ends the call ``unknown``, and the route's probe later finds the
ticket.

It is built on the official MCP Python SDK (``MCPServer``) and speaks the
Streamable HTTP transport at ``/mcp``: sessions (``Mcp-Session-Id``) and SSE
answers by default, ``--stateless`` and ``--json-response`` to change that.

Run it with::

    python -m examples.mcp_server --host 127.0.0.1 --port 9100

or, with ``--stdio``, as a stdio server (one message a line on stdin and stdout): the
form most MCP servers take, which a gateway route with ``command = [...]`` starts
itself (``config/gateway.toml``, route ``mcp-stdio``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations
from pydantic import Field
from typing_extensions import TypedDict  # pydantic needs it for nested TypedDicts on 3.11

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence

__all__ = ["MCP_PATH", "ServerState", "create_server", "main"]

MCP_PATH = "/mcp"

IDEMPOTENCY_KEY_META = "idempotencyKey"

MAX_DELAY_SECONDS = 3600.0


class Ticket(TypedDict):
    id: str
    title: str
    idempotency_key: str | None


class Email(TypedDict):
    id: str
    to: str
    subject: str
    idempotency_key: str | None


class TicketList(TypedDict):
    items: list[Ticket]


class TicketFound(TypedDict):
    found: bool
    ticket: Ticket | None


@dataclass
class ServerState:
    """Everything the server remembers; one per server."""

    tickets: list[Ticket] = field(default_factory=list)
    emails: list[Email] = field(default_factory=list)
    late_work: set[asyncio.Future[Ticket]] = field(default_factory=set)
    """Slow calls still being applied (their callers may have left)."""


def create_server(state: ServerState | None = None) -> MCPServer:
    """Build the MCP server; its tools share `state` (a fresh one by default).

    >>> app = create_server().streamable_http_app()  # an ASGI app serving /mcp
    """
    state = ServerState() if state is None else state
    # WARNING: MCPServer configures logging (basicConfig) at this level.
    mcp = MCPServer(
        "example-tickets",
        instructions=(
            "Create tickets, send emails, list and find tickets. Nothing here dedupes a retry."
        ),
        log_level="WARNING",
    )
    writes = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False)

    @mcp.tool(annotations=writes, structured_output=True)
    async def create_ticket(
        title: str,
        ctx: Context,
        delay_seconds: Annotated[float, Field(ge=0, le=MAX_DELAY_SECONDS)] = 0.0,
    ) -> Ticket:
        """Create a ticket. Every call creates a new one, retries included. delay_seconds
        (a demo switch) waits that long first, as a slow tool would."""
        key = _idempotency_key(ctx)

        async def create() -> Ticket:
            await asyncio.sleep(delay_seconds)
            ticket = Ticket(id=f"T-{len(state.tickets) + 1}", title=title, idempotency_key=key)
            state.tickets.append(ticket)
            return ticket

        if not delay_seconds:
            return await create()
        # The SDK cancels a call whose caller went away; a slow tool applies it anyway,
        # late: the work is a task of its own, kept until it is done.
        late = asyncio.ensure_future(create())
        state.late_work.add(late)
        late.add_done_callback(state.late_work.discard)
        return await asyncio.shield(late)

    @mcp.tool(annotations=writes, structured_output=True)
    async def send_email(to: str, subject: str, ctx: Context) -> Email:
        """Send an email. Every call sends one, retries included."""
        email = Email(
            id=f"E-{len(state.emails) + 1}",
            to=to,
            subject=subject,
            idempotency_key=_idempotency_key(ctx),
        )
        state.emails.append(email)
        return email

    @mcp.tool(annotations=ToolAnnotations(read_only_hint=True), structured_output=True)
    async def list_tickets() -> TicketList:
        """List every ticket in creation order, with the idempotency key it arrived with."""
        return TicketList(items=list(state.tickets))

    @mcp.tool(annotations=ToolAnnotations(read_only_hint=True), structured_output=True)
    async def find_ticket(idempotency_key: str) -> TicketFound:
        """Find the ticket created by the call that carried this idempotency key (what the
        gateway forwarded): found is false when no call carried it."""
        for ticket in state.tickets:
            if ticket["idempotency_key"] == idempotency_key:
                return TicketFound(found=True, ticket=ticket)
        return TicketFound(found=False, ticket=None)

    return mcp


def _idempotency_key(ctx: Context) -> str | None:
    """The ``_meta.idempotencyKey`` of the call `ctx` belongs to, as it arrived."""
    params: Mapping[str, Any] = ctx.request_context.params or {}
    meta = params.get("_meta")
    key = meta.get(IDEMPOTENCY_KEY_META) if isinstance(meta, dict) else None
    return key if isinstance(key, str) else None


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: ``_serve`` stops it on SIGINT/SIGTERM
    and the process exits 0 (uvicorn would re-raise the signal after shutting down)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _listen(host: str, port: int) -> socket.socket:
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on accepted connections only for a
    # socket that says it is TCP (else each keep-alive answer waits for a delayed ACK).
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


async def _serve(sock: socket.socket, *, json_response: bool, stateless: bool) -> None:
    host, port = sock.getsockname()[:2]
    mcp = create_server()
    app = mcp.streamable_http_app(
        streamable_http_path=MCP_PATH,
        json_response=json_response,
        stateless_http=stateless,
        host=host,  # 127.0.0.1/localhost: the SDK turns on DNS-rebinding protection
    )
    config = uvicorn.Config(
        app,
        ws="none",
        # The app's lifespan only runs the SDK's session manager; it runs below instead,
        # so that stopping ends the sessions (and their open SSE streams) first.
        lifespan="off",
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=2,  # for requests still open after that
    )
    server = _Server(config)
    # Handlers first: a signal at any point from here on stops the server cleanly.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    async with mcp.session_manager.run():
        serving = asyncio.create_task(server.serve(sockets=[sock]))
        stopping = asyncio.create_task(stop.wait())
        while not server.started and not serving.done() and not stopping.done():
            await asyncio.wait({serving, stopping}, timeout=0.01)
        if server.started:
            shown = f"[{host}]" if ":" in host else host
            # Scripts and tests wait for this exact line before connecting.
            print(f"MCP server listening on http://{shown}:{port}{MCP_PATH}", flush=True)
            await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        server.should_exit = True
        for listener in getattr(server, "servers", []):
            listener.close()  # no new request may arrive once the sessions are gone
    await serving


def main(argv: Sequence[str] | None = None) -> int:
    """Serve the example MCP server until SIGINT or SIGTERM.

    >>> main(["--port", "0"])  # prints "MCP server listening on http://127.0.0.1:<port>/mcp"
    """
    parser = argparse.ArgumentParser(
        prog="python -m examples.mcp_server",
        description="An example MCP server (Streamable HTTP) with side-effecting tools.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=9100, help="port; 0 lets the OS choose")
    parser.add_argument(
        "--json-response",
        action="store_true",
        help="answer POSTs with application/json instead of text/event-stream",
    )
    parser.add_argument(
        "--stateless", action="store_true", help="no sessions: every POST stands alone"
    )
    parser.add_argument(
        "--stdio",
        action="store_true",
        help="speak MCP on stdin/stdout instead (a stdio route's command starts it so)",
    )
    args = parser.parse_args(argv)
    if args.stdio:
        create_server().run("stdio")
        return 0
    try:
        sock = _listen(args.host, args.port)
    except OSError as exc:
        print(f"cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    with sock:
        asyncio.run(_serve(sock, json_response=args.json_response, stateless=args.stateless))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
