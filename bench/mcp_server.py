"""The MCP upstream of the MCP rows: one fast side-effecting tool on the official SDK.

An `MCPServer` (the `mcp` SDK's high-level server, as tests/mcp_upstream.py
builds it) with one tool, `create_ticket(title)`, which appends a ticket and
answers it as structured content: the least work a tool with an effect can
do, so the rows measure the protocol and the gateway, not the tool. It is
served over Streamable HTTP by uvicorn in its own process (so its CPU time is
its own), on 127.0.0.1 and a port the OS chooses, at `/mcp`. It prints
"MCP server listening on http://HOST:PORT/mcp" once it accepts connections,
the line `bench.processes.ServerProcess` waits for.

Unlike the test server it records nothing per request (the tickets list aside,
a few bytes a call), so a long row does not grow it much.

    python -m bench.mcp_server --port 0               # answers as event streams (SSE)
    python -m bench.mcp_server --port 0 --json-response
"""

from __future__ import annotations

import argparse
import socket
from collections.abc import Sequence

import uvicorn
from mcp.server.mcpserver import MCPServer
from typing_extensions import TypedDict  # what pydantic wants on 3.11

__all__ = ["PATH", "TOOL", "build", "main"]

PATH = "/mcp"
TOOL = "create_ticket"
_SHUTDOWN_GRACE = 2
"""Seconds uvicorn gives open requests (an SSE stream a client left open) on SIGTERM."""


class Ticket(TypedDict):
    id: str
    title: str


def build() -> MCPServer:
    """The server: `create_ticket(title)` -> `{"id": "T-<n>", "title": title}`."""
    mcp = MCPServer("bench-mcp-upstream", log_level="WARNING")
    count = 0

    async def create_ticket(title: str) -> Ticket:
        """Create a ticket (an effect: the count goes up)."""
        nonlocal count
        count += 1
        return Ticket(id=f"T-{count}", title=title)

    mcp.add_tool(create_ticket, name=TOOL, structured_output=True)
    return mcp


class _Server(uvicorn.Server):
    """uvicorn that says where it listens once it does (the port is the OS's choice)."""

    def __init__(self, config: uvicorn.Config, sock: socket.socket) -> None:
        super().__init__(config)
        self._sock = sock

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            host, port = self._sock.getsockname()[:2]
            print(f"MCP server listening on http://{host}:{port}{PATH}", flush=True)


def _serve(host: str, port: int, *, json_response: bool) -> None:
    app = build().streamable_http_app(
        streamable_http_path=PATH, json_response=json_response, host=host
    )
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets whose proto says TCP,
    # and without it every keep-alive answer written in two parts (headers, then body)
    # waits ~40 ms for the client's delayed ACK.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    config = uvicorn.Config(
        app,
        lifespan="on",  # the app's lifespan runs the SDK's session manager
        log_config=None,
        log_level="warning",
        access_log=False,
        proxy_headers=False,
        timeout_graceful_shutdown=_SHUTDOWN_GRACE,
    )
    # uvicorn's loop "auto" is uvloop when installed, as the gateway's rule; its own
    # SIGTERM handler starts a graceful shutdown.
    _Server(config, sock).run(sockets=[sock])


def main(argv: Sequence[str] | None = None) -> int:
    """Serve until SIGINT or SIGTERM."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.mcp_server", description="A one-tool MCP server for the benchmark."
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port; 0 lets the OS choose")
    parser.add_argument(
        "--json-response",
        action="store_true",
        help="answer a request with application/json instead of an event stream",
    )
    parser.add_argument(
        "--stdio",
        action="store_true",
        help="speak MCP on stdin/stdout instead (a gateway stdio route starts it so)",
    )
    args = parser.parse_args(argv)
    if args.stdio:
        build().run("stdio")
        return 0
    _serve(args.host, args.port, json_response=args.json_response)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
