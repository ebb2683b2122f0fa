"""The counting upstream does what gateway tests script it to do."""

from __future__ import annotations

import asyncio
import gzip
import json
import time
from typing import TYPE_CHECKING

import aiohttp
import pytest
from upstream import CountingUpstream

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from upstream import UpstreamFactory


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as client:
        yield client


async def test_default_post_describes_the_effect(
    upstream: CountingUpstream, session: aiohttp.ClientSession
) -> None:
    """A POST answers 201 with JSON describing the effect and counts it once."""
    async with session.post(
        f"{upstream.url}/v1/issues?a=1",
        data=b'{"title": "x"}',
        headers={"Idempotency-Key": "k1", "X-Trace": "t"},
    ) as response:
        assert response.status == 201
        assert response.headers["Content-Type"] == "application/json"
        assert response.headers["X-Effect-Id"] == "1"
        assert await response.json() == {
            "effect": 1,
            "method": "POST",
            "path": "/v1/issues",
            "query": "a=1",
            "key": "k1",
            "body": '{"title": "x"}',
        }
    [effect] = upstream.effects
    assert (effect.number, effect.method, effect.path, effect.query) == (
        1,
        "POST",
        "/v1/issues",
        "a=1",
    )
    assert (effect.key, effect.body, effect.headers["x-trace"]) == ("k1", b'{"title": "x"}', "t")
    assert upstream.count == 1
    assert upstream.count_for("k1") == 1
    assert upstream.count_for("other") == 0


async def test_get_defaults_to_200_without_key(
    upstream: CountingUpstream, session: aiohttp.ClientSession
) -> None:
    """A GET answers 200 and records a null key."""
    async with session.get(f"{upstream.url}/anything") as response:
        assert response.status == 200
        assert (await response.json())["key"] is None
    assert upstream.effects[0].key is None


async def test_status_is_scripted(
    upstream: CountingUpstream, session: aiohttp.ClientSession
) -> None:
    """status=N answers with N, and every request still counts as an effect."""
    async with session.post(f"{upstream.url}/x?status=503") as response:
        assert response.status == 503
    async with session.post(f"{upstream.url}/x?status=204") as response:
        assert response.status == 204
        assert await response.read() == b""
    assert upstream.count == 2


async def test_delay_applies_the_effect_before_answering(
    upstream: CountingUpstream, session: aiohttp.ClientSession
) -> None:
    """delay=S counts the effect at once and answers S seconds later."""
    started = time.monotonic()
    request = asyncio.create_task(session.post(f"{upstream.url}/x?delay=0.3"))
    await upstream.wait_for_count(1)
    assert not request.done()
    response = await request
    response.release()
    assert response.status == 201
    assert time.monotonic() - started >= 0.3


async def test_drop_after_effect_counts_but_never_answers(
    upstream: CountingUpstream, session: aiohttp.ClientSession
) -> None:
    """drop=after_effect applies the effect and the client sees a lost connection."""
    with pytest.raises(aiohttp.ServerDisconnectedError):
        async with session.post(
            f"{upstream.url}/x?drop=after_effect", headers={"Idempotency-Key": "k"}
        ):
            pass
    assert upstream.count_for("k") == 1


async def test_drop_mid_body_truncates_the_response(
    upstream: CountingUpstream, session: aiohttp.ClientSession
) -> None:
    """drop=mid_body sends headers and part of the body, so reading it fails."""
    async with session.post(f"{upstream.url}/x?drop=mid_body&size=1000") as response:
        assert response.status == 201
        assert response.content_length == 1000
        with pytest.raises(aiohttp.ClientPayloadError):
            await response.read()
    assert upstream.count == 1


async def test_size_gives_a_deterministic_body(
    upstream: CountingUpstream, session: aiohttp.ClientSession
) -> None:
    """size=N answers N bytes, the same bytes every time."""
    bodies = []
    for _ in range(2):
        async with session.get(f"{upstream.url}/x?size=100000") as response:
            bodies.append(await response.read())
    assert len(bodies[0]) == 100000
    assert bodies[0] == bodies[1]
    assert len(set(bodies[0])) > 1


async def test_redirect_is_a_plain_302(
    upstream: CountingUpstream, session: aiohttp.ClientSession
) -> None:
    """redirect=URL answers 302 with that Location."""
    target = "http://127.0.0.1:9/elsewhere"
    async with session.post(
        f"{upstream.url}/x", params={"redirect": target}, allow_redirects=False
    ) as response:
        assert response.status == 302
        assert response.headers["Location"] == target
    assert upstream.count == 1


async def test_gzip_body_is_compressed_on_the_wire(
    upstream: CountingUpstream,
) -> None:
    """gzip=1 sends a gzip body with Content-Encoding: gzip."""
    async with (
        aiohttp.ClientSession(auto_decompress=False) as raw,
        raw.post(f"{upstream.url}/x?gzip=1") as response,
    ):
        assert response.headers["Content-Encoding"] == "gzip"
        body = await response.read()
    assert json.loads(gzip.decompress(body))["effect"] == 1


async def test_cookie_adds_sensitive_and_custom_headers(
    upstream: CountingUpstream, session: aiohttp.ClientSession
) -> None:
    """cookie=1 adds Set-Cookie: session=secret and X-Custom: yes."""
    async with session.get(f"{upstream.url}/x?cookie=1") as response:
        assert response.headers["Set-Cookie"] == "session=secret"
        assert response.headers["X-Custom"] == "yes"


async def test_connections_are_counted(upstream: CountingUpstream) -> None:
    """Requests on one keep-alive connection count one connection; a new session, another."""
    for _ in range(2):
        async with aiohttp.ClientSession() as client:
            for _ in range(3):
                async with client.get(f"{upstream.url}/x") as response:
                    await response.read()
    assert upstream.count == 6
    assert upstream.connections == 2


async def test_reset_forgets_effects(
    upstream: CountingUpstream, session: aiohttp.ClientSession
) -> None:
    """reset() clears effects and connections and numbering starts again."""
    async with session.post(f"{upstream.url}/x") as response:
        await response.read()
    upstream.reset()
    assert (upstream.count, upstream.connections) == (0, 0)
    async with session.post(f"{upstream.url}/x") as response:
        assert response.headers["X-Effect-Id"] == "1"


async def test_factory_keepalive_timeout_closes_idle_connections(
    upstream_factory: UpstreamFactory, session: aiohttp.ClientSession
) -> None:
    """A short keepalive_timeout makes the upstream close idle connections."""
    quick = await upstream_factory(keepalive_timeout=0.1)
    async with session.get(f"{quick.url}/x") as response:
        await response.read()
    await asyncio.sleep(0.3)
    async with session.get(f"{quick.url}/x") as response:
        await response.read()
    assert quick.connections == 2


async def test_factory_upstreams_are_independent(upstream_factory: UpstreamFactory) -> None:
    """Each upstream from the factory listens on its own port and counts its own effects."""
    first = await upstream_factory()
    second = await upstream_factory()
    assert first.url != second.url
    assert first.url.startswith("http://127.0.0.1:")


async def test_url_before_start_is_an_error() -> None:
    """An upstream that is not started has no URL."""
    with pytest.raises(RuntimeError, match="not started"):
        _ = CountingUpstream().url
