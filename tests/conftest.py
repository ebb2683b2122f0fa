"""Shared fixtures: real servers on loopback, cleaned up after each test."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest_asyncio
from upstream import CountingUpstream

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from upstream import UpstreamFactory


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
