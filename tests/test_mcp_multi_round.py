"""Multi-round tool calls (2026-07-28): an `input_required` round is not the receipt.

The server answers the first round of a call with `InputRequiredResult` (it
asks the user to confirm); the client answers and sends the same call again,
same key and arguments, with the input. The gateway must let that round
through (the call has not run yet) and keep the final answer as the receipt.
Found by the Python client's MCP tests: the first round was kept, every later
round replayed it, and the tool never ran.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Annotated, Any

import httpx2
import pytest_asyncio
import uvicorn
from conftest import GatewayFactory
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.resolve import Elicit, Resolve
from mcp.types import ElicitResult
from mcp_upstream import MODERN
from pydantic import BaseModel


class Confirm(BaseModel):
    ok: bool


def ask(title: str) -> Elicit[Confirm]:
    return Elicit(f"create {title}?", Confirm)


class ConfirmingServer:
    """An MCP server whose one tool asks for confirmation before its effect."""

    def __init__(self) -> None:
        self.effects: list[str] = []
        self.url = ""

    def app(self) -> Any:
        mcp = MCPServer("confirming", log_level="WARNING")

        @mcp.tool()
        async def confirmed_ticket(
            title: str, confirm: Annotated[Confirm, Resolve(ask)], ctx: Context
        ) -> dict[str, str]:
            self.effects.append(title)
            return {"id": f"T-{len(self.effects)}", "title": title}

        return mcp.streamable_http_app(streamable_http_path="/mcp", host="127.0.0.1")


@pytest_asyncio.fixture
async def confirming() -> AsyncIterator[ConfirmingServer]:
    server = ConfirmingServer()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(server.app(), log_config=None, access_log=False, lifespan="on")
    serving = uvicorn.Server(config)
    task = asyncio.create_task(serving.serve(sockets=[sock]))
    async with asyncio.timeout(10):
        while not serving.started:  # noqa: ASYNC110 (uvicorn offers no event for it)
            await asyncio.sleep(0.01)
    server.url = f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
    yield server
    serving.should_exit = True
    await task


async def test_an_input_required_round_passes_and_the_final_answer_is_the_receipt(
    gateway_factory: GatewayFactory, confirming: ConfirmingServer
) -> None:
    route = {"name": "tools", "prefix": "/tools", "upstream": confirming.url, "kind": "mcp"}
    gateway = await gateway_factory(confirming.url, route=route)
    asked: list[str] = []

    async def elicit(context: Any, params: Any) -> ElicitResult:
        asked.append(params.message)
        return ElicitResult(action="accept", content={"ok": True})

    async with (
        asyncio.timeout(20),
        httpx2.AsyncClient() as http,
        Client(
            streamable_http_client(gateway.url + "/tools", http_client=http),
            mode=MODERN,
            elicitation_callback=elicit,
            cache=None,
        ) as client,
    ):
        first = await client.call_tool(
            "confirmed_ticket", {"title": "x"}, meta={"idempotencyKey": "mr-1"}
        )
        again = await client.call_tool(
            "confirmed_ticket", {"title": "x"}, meta={"idempotencyKey": "mr-1"}
        )
    assert asked == ["create x?"]  # once: the retry is a replay, no new question
    assert confirming.effects == ["x"]
    assert first.is_error is False
    assert (again.meta or {}).get("idempotencyReplayed") is True
    operation = await (await gateway.get("/operations/mr-1")).json()
    assert (operation["state"], operation["attempts"]) == ("completed", 2)
