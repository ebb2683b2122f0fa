"""A stdio MCP server on the official `mcp` SDK, for the gateway to start as a child.

Run as `python tests/stdio_mcp_server.py EFFECTS [STARTED]` (paths on the command line:
a subprocess gateway's config masks a route's `env`). Every effect is a line appended to
the JSON-lines file EFFECTS (`{"key", "tool", "title", "pid", "id"}`,
`key` the `_meta.idempotencyKey` the call carried), so a test counts effects across
children and restarts, and a probe tool reads them back (the children share state,
as a server on one database would: `shared_state = true`). STARTED, when
given, gets a line `{"pid", "key"}` as a slow call begins: a test waits for it, then
kills the child (or the gateway) in the window.

Tools: `create_ticket(title)`; `slow_ticket(title, seconds)` (applies the effect, then
takes `seconds` to answer); `find_ticket(key)` (read-only: the effect made under a
forwarded key, or not found); `whoami()` (read-only: the child's pid, its parent's, its uid and the
names of its environment, which tests check for leaks); `ask_the_client()` (sends the client a
sampling request and reports how it was answered).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any, TypedDict

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations

READ_ONLY = ToolAnnotations(read_only_hint=True)


class Ticket(TypedDict):
    id: str
    title: str
    pid: int


def _key(ctx: Context) -> str | None:
    meta = (ctx.request_context.params or {}).get("_meta") or {}
    key = meta.get("idempotencyKey") if isinstance(meta, dict) else None
    return key if isinstance(key, str) else None


def _effects() -> list[dict[str, Any]]:
    path = Path(sys.argv[1])
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def _apply(tool: str, title: str, ctx: Context) -> Ticket:
    ticket = Ticket(id=f"T-{len(_effects()) + 1}", title=title, pid=os.getpid())
    line = {"key": _key(ctx), "tool": tool, **ticket}
    with open(sys.argv[1], "a") as effects:
        effects.write(json.dumps(line) + "\n")
    return ticket


def build() -> MCPServer:
    mcp = MCPServer("stdio-test-server", log_level="WARNING")

    async def create_ticket(title: str, ctx: Context) -> Ticket:
        """Create a ticket (an effect)."""
        return _apply("create_ticket", title, ctx)

    async def slow_ticket(title: str, seconds: float, ctx: Context) -> Ticket:
        """Create a ticket, then take `seconds` to answer."""
        ticket = _apply("slow_ticket", title, ctx)
        if len(sys.argv) > 2:
            started = sys.argv[2]
            line = json.dumps({"pid": os.getpid(), "key": _key(ctx)}) + "\n"
            with Path(started).open("a") as file:  # noqa: ASYNC230 (a line, once)
                file.write(line)
        await asyncio.sleep(seconds)
        return ticket

    async def find_ticket(key: str) -> dict[str, Any]:
        """The ticket created under this forwarded key (`found` false when none)."""
        for effect in _effects():
            if effect["key"] == key:
                return {"found": True, "ticket": effect}
        return {"found": False}

    async def whoami() -> dict[str, Any]:
        """This child's pid and the names of its environment variables."""
        return {
            "pid": os.getpid(), "ppid": os.getppid(), "uid": os.getuid(),
            "env": sorted(os.environ),
        }  # fmt: skip

    async def ask_the_client(ctx: Context) -> dict[str, Any]:
        """Ask the client to sample (a server-to-client request) and say what came back."""
        try:
            await ctx.session.create_message(messages=[], max_tokens=1)
        except Exception as exc:  # the answer is the point
            return {"refused": str(exc)}
        return {"refused": None}

    for tool in (create_ticket, slow_ticket):
        mcp.add_tool(tool, structured_output=True)
    for tool in (find_ticket, whoami, ask_the_client):
        mcp.add_tool(tool, annotations=READ_ONLY, structured_output=True)
    return mcp


if __name__ == "__main__":
    build().run("stdio")
