"""Shared fixtures: real servers on loopback, cleaned up after each test."""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import pytest_asyncio
from aiohttp import web
from harness import GatewayProcess, RunningGateway, settings_for, start_gateway, stop_gateway
from pg import schema_url, server_in_use, vacuum_catalogs
from suite_profile import PROFILE_ENV, load_hypothesis_profile, profile
from upstream import CountingUpstream

from examples.tool_api import STATE, ToolState, create_app

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from upstream import UpstreamFactory

# The session fails (and kills them) if processes the tests started are still running at its end.
pytest_plugins = ("process_leaks",)

# Before any test module is imported: their `@settings` inherit the profile's defaults.
load_hypothesis_profile()


def pytest_sessionstart(session: pytest.Session) -> None:
    """Once a run, in the controller (not in each xdist worker), before any test: the test
    database's catalogs compacted (`pg.vacuum_catalogs`: what earlier runs' schemas left)."""
    if not hasattr(session.config, "workerinput") and not session.config.option.collectonly:
        vacuum_catalogs()


def pytest_report_header() -> str:
    """Say which profile runs, so a fast run is never mistaken for the full counts."""
    return f"test profile: {profile()} ({PROFILE_ENV}=full: every property at its full count)"


@pytest.fixture
def refused_port() -> Iterator[int]:
    """A loopback port that refuses connections for the whole test: bound (without
    SO_REUSEADDR) and never listening, so no other test's server, whose port 0 the OS
    chooses, is given it. A port only probed and closed was: a gateway in front of one
    answered another test's 404 instead of its own 502."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield int(held.getsockname()[1])


@pytest_asyncio.fixture
async def upstream() -> AsyncIterator[CountingUpstream]:
    """A started counting upstream with default options."""
    async with CountingUpstream() as started:
        yield started


@pytest_asyncio.fixture
async def upstream_factory() -> AsyncIterator[UpstreamFactory]:
    """Start counting upstreams with custom options; all are stopped after the test."""
    made: list[CountingUpstream] = []

    async def make(
        *, keepalive_timeout: float = 75.0, shutdown_timeout: float = 1.0
    ) -> CountingUpstream:
        started = CountingUpstream(
            keepalive_timeout=keepalive_timeout, shutdown_timeout=shutdown_timeout
        )
        await started.start()
        made.append(started)
        return started

    yield make
    for started in reversed(made):
        await started.stop()


GatewayFactory = Callable[..., Awaitable[RunningGateway]]


@pytest_asyncio.fixture
async def gateway_factory(tmp_path: Path) -> AsyncIterator[GatewayFactory]:
    """Start in-process gateways (settings as `harness.settings_for`); all stopped after."""
    made: list[RunningGateway] = []

    async def make(upstream_url: str, **options: Any) -> RunningGateway:
        started = await start_gateway(settings_for(tmp_path, upstream_url, **options))
        made.append(started)
        return started

    yield make
    for started in reversed(made):
        await stop_gateway(started)


@pytest_asyncio.fixture
async def gateway(gateway_factory: GatewayFactory, upstream: CountingUpstream) -> RunningGateway:
    """A gateway with route /tickets in front of the counting upstream."""
    return await gateway_factory(upstream.url)


@pytest.fixture(autouse=True)
def _postgres_server_in_use(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test marked `postgres` holds the server (shared) from its first fixture to its last,
    so the test that restarts the server waits for it (`pg.restart_alone`)."""
    if request.node.get_closest_marker("postgres") is None:
        yield
        return
    with server_in_use():
        yield


@pytest.fixture
def processes() -> Iterator[list[GatewayProcess]]:
    """Every gateway process a test starts is stopped afterwards, even a paused one."""
    started: list[GatewayProcess] = []
    yield started
    for process in started:
        process.stop()


@pytest_asyncio.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    ]
)
async def store_url(request: pytest.FixtureRequest) -> AsyncIterator[str | None]:
    """None for the default SQLite file, or a fresh PostgreSQL schema dropped afterwards."""
    if request.param == "sqlite":
        yield None
        return
    async with schema_url() as url:
        yield url


@pytest_asyncio.fixture
async def postgres_url() -> AsyncIterator[str]:
    """A fresh PostgreSQL schema for this test only, dropped afterwards.

    Request it before `processes`: fixtures are torn down in reverse, so the
    gateways on the schema stop before it is dropped.
    """
    async with schema_url() as url:
        yield url


@dataclass
class ToolAPI:
    url: str
    state: ToolState


@pytest_asyncio.fixture
async def tool_api() -> AsyncIterator[ToolAPI]:
    """The example ticket API on loopback; its state counts tickets and emails."""
    app = create_app()
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    yield ToolAPI(url=f"http://{host}:{port}", state=app[STATE])
    await runner.cleanup()


@pytest_asyncio.fixture
async def tickets(gateway_factory: GatewayFactory, tool_api: ToolAPI) -> RunningGateway:
    """The gateway with route /tickets in front of the example ticket API."""
    return await gateway_factory(tool_api.url)
