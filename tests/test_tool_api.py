"""The example ticket tool API: effects with no idempotency, found by their forwarded key."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp
import pytest
from aiohttp import web

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

from examples.tool_api import create_app

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
async def tool_api() -> AsyncIterator[str]:
    runner = web.AppRunner(create_app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    await runner.cleanup()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as client:
        yield client


async def test_create_issue_increments_ids(tool_api: str, session: aiohttp.ClientSession) -> None:
    """Every POST creates a new ticket, even for the same request."""
    for expected in ("T-1", "T-2"):
        async with session.post(f"{tool_api}/v1/issues", json={"title": "Disk full"}) as response:
            assert response.status == 201
            assert await response.json() == {
                "id": expected,
                "title": "Disk full",
                "idempotency_key": None,
            }


async def test_list_issues(tool_api: str, session: aiohttp.ClientSession) -> None:
    """GET /v1/issues lists every ticket in creation order."""
    for title in ("a", "b"):
        async with session.post(
            f"{tool_api}/v1/issues", json={"title": title}, headers={"Idempotency-Key": title}
        ):
            pass
    async with session.get(f"{tool_api}/v1/issues") as response:
        assert response.status == 200
        assert await response.json() == {
            "items": [
                {"id": "T-1", "title": "a", "idempotency_key": "a"},
                {"id": "T-2", "title": "b", "idempotency_key": "b"},
            ]
        }


async def test_lookup_by_idempotency_key(tool_api: str, session: aiohttp.ClientSession) -> None:
    """The Idempotency-Key a ticket arrived with finds it (the probe endpoint): 200 with
    the ticket, or 404 when there is none. The API still does not dedupe on it."""
    headers = {"Idempotency-Key": "op_01-r1"}
    for _ in range(2):
        async with session.post(f"{tool_api}/v1/issues", json={"title": "t"}, headers=headers):
            pass
    query = {"idempotency_key": "op_01-r1"}
    async with session.get(f"{tool_api}/v1/issues", params=query) as response:
        assert response.status == 200
        assert await response.json() == {"id": "T-1", "title": "t", "idempotency_key": "op_01-r1"}
    query = {"idempotency_key": "op_01-r2"}
    async with session.get(f"{tool_api}/v1/issues", params=query) as response:
        assert response.status == 404
        assert await response.json() == {"error": "not found"}
    async with session.get(f"{tool_api}/v1/stats") as response:
        assert (await response.json())["issues"] == 2


async def test_emails_and_stats(tool_api: str, session: aiohttp.ClientSession) -> None:
    """POST /v1/emails answers 202, and stats count issues and emails."""
    email = {"to": "ops@example.com", "subject": "hi"}
    async with session.post(f"{tool_api}/v1/emails", json=email) as response:
        assert response.status == 202
        assert await response.json() == {"id": "E-1", **email}
    async with session.get(f"{tool_api}/v1/emails") as response:
        assert await response.json() == {"items": [{"id": "E-1", **email}]}
    async with session.get(f"{tool_api}/v1/stats") as response:
        assert await response.json() == {"issues": 0, "emails": 1}


@pytest.mark.parametrize(
    ("path", "data"),
    [
        ("/v1/issues", b"{not json"),
        ("/v1/issues", b"[]"),
        ("/v1/issues", b'{"title": 3}'),
        ("/v1/emails", b'{"to": "a@b"}'),
        ("/v1/emails", b"\xff"),
    ],
)
async def test_bad_body_is_a_400_json_error(
    tool_api: str, session: aiohttp.ClientSession, path: str, data: bytes
) -> None:
    """A body that is not the expected JSON object is refused with a JSON error and no effect."""
    async with session.post(f"{tool_api}{path}", data=data) as response:
        assert response.status == 400
        assert "error" in await response.json()
    async with session.get(f"{tool_api}/v1/stats") as response:
        assert await response.json() == {"issues": 0, "emails": 0}


async def test_cli_prints_its_address_when_ready() -> None:
    """python -m examples.tool_api prints one line with its address, then serves."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "examples.tool_api",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        async with asyncio.timeout(120):  # starting Python on a loaded machine
            line = (await process.stdout.readline()).decode().strip()
        prefix = "tool API listening on "
        assert line.startswith(f"{prefix}http://127.0.0.1:")
        async with (
            aiohttp.ClientSession() as client,
            client.get(f"{line.removeprefix(prefix)}/v1/stats") as response,
        ):
            assert await response.json() == {"issues": 0, "emails": 0}
    finally:
        process.terminate()
        assert await process.wait() == 0


async def test_delay_applies_the_effect_late_even_when_the_caller_left(
    tool_api: str, session: aiohttp.ClientSession
) -> None:
    """`?delay=` (the README's slow tool): the ticket is created after the delay, whether
    or not the caller still waits for the answer, as a tool that applies a request late."""
    with pytest.raises(asyncio.TimeoutError):
        async with session.post(
            f"{tool_api}/v1/issues?delay=0.5",
            json={"title": "late"},
            timeout=aiohttp.ClientTimeout(total=0.05),
        ):
            pass
    async with asyncio.timeout(30):
        while True:
            async with session.get(f"{tool_api}/v1/issues") as response:
                items = (await response.json())["items"]
            if items:
                break
            await asyncio.sleep(0.05)
    assert [item["title"] for item in items] == ["late"]


@pytest.mark.parametrize("delay", ["soon", "-1", "nan", "inf", "3601"])
async def test_a_delay_that_is_not_a_number_of_seconds_is_a_400(
    tool_api: str, session: aiohttp.ClientSession, delay: str
) -> None:
    async with session.post(
        f"{tool_api}/v1/issues", params={"delay": delay}, json={"title": "t"}
    ) as response:
        assert response.status == 400
        assert "delay" in (await response.json())["error"]
    async with session.get(f"{tool_api}/v1/stats") as response:
        assert await response.json() == {"issues": 0, "emails": 0}
