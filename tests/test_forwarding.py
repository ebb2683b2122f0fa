"""The gateway as a reverse proxy: what reaches the upstream, and what comes back."""

from __future__ import annotations

import asyncio
import gzip
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from harness import RunningGateway
from upstream import CountingUpstream, UpstreamFactory
from yarl import URL

GatewayFactory = Callable[..., Awaitable[RunningGateway]]

PROBLEM_JSON = "application/problem+json"


async def problem_of(response: aiohttp.ClientResponse, status: int, problem_type: str) -> Any:
    """Check that a response is the named problem and return its document."""
    assert response.status == status
    assert response.content_type == PROBLEM_JSON
    document = json.loads(await response.read())
    assert document["type"].rsplit("/", 1)[-1] == problem_type
    assert document["status"] == status
    return document


async def test_prefix_stripped_query_method_and_body_forwarded_verbatim(
    gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    """The route prefix is stripped; query, method and body reach the upstream byte for byte."""
    body = b"\x00\x01 raw \xff\xfe bytes\r\n"
    query = "b=2&a=1&a=3"
    for method, key in (("POST", "fwd-post"), ("PATCH", "fwd-patch")):
        response = await gateway.session.request(
            method,
            URL(f"{gateway.url}/tickets/v1/issues?{query}", encoded=True),
            data=body,
            headers={"Idempotency-Key": key, "Content-Type": "application/octet-stream"},
        )
        await response.read()
        assert response.status == (201 if method == "POST" else 200)

    assert upstream.count == 2
    for effect, method in zip(upstream.effects, ("POST", "PATCH"), strict=True):
        assert effect.method == method
        assert effect.path == "/v1/issues"
        assert effect.query == query
        assert effect.body == body
        assert effect.headers["content-type"] == "application/octet-stream"


async def test_longest_prefix_wins(
    upstream_factory: UpstreamFactory, gateway_factory: GatewayFactory
) -> None:
    """/tickets/special goes to its own upstream; /tickets and /tickets/specialx do not."""
    general = await upstream_factory()
    special = await upstream_factory()
    gateway = await gateway_factory(
        general.url,
        extra_routes=[{"name": "special", "prefix": "/tickets/special", "upstream": special.url}],
    )

    assert (await gateway.post("/tickets/special/v1/x", key="lp-1", data=b"s")).status == 201
    assert (await gateway.post("/tickets/v1/y", key="lp-2", data=b"g")).status == 201
    assert (await gateway.post("/tickets/specialx", key="lp-3", data=b"g")).status == 201

    assert special.count == 1
    assert special.effects[0].path == "/v1/x"
    assert general.count == 2
    assert [effect.path for effect in general.effects] == ["/v1/y", "/specialx"]


async def test_no_route_is_a_404_problem(
    gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    """A path no route matches gets a 404 `no-route` problem and reaches no upstream."""
    response = await gateway.post("/elsewhere/v1/issues", key="nr-1", json_body={"a": 1})

    document = await problem_of(response, 404, "no-route")
    assert document["safe_to_retry"] is False
    assert upstream.count == 0


async def test_hop_by_hop_headers_dropped_and_proxy_headers_added(
    gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    """Hop-by-hop headers stay at the gateway; end-to-end ones and the client hop go upstream."""
    response = await gateway.post(
        "/tickets/v1/issues",
        key="hop-1",
        json_body={"a": 1},
        headers={
            "Connection": "x-hop",
            "X-Hop": "1",
            "Keep-Alive": "timeout=5",
            "Proxy-Authorization": "Basic eA==",
            "X-End-To-End": "kept",
            "Accept-Language": "fr",
            "X-Forwarded-For": "203.0.113.9",
        },
    )
    assert response.status == 201

    assert upstream.count == 1
    seen = upstream.effects[0].headers
    for hop in ("x-hop", "keep-alive", "proxy-authorization"):
        assert hop not in seen
    assert "x-hop" not in seen.get("connection", "").lower()
    assert seen["x-end-to-end"] == "kept"
    assert seen["accept-language"] == "fr"
    # The caller is no trusted proxy: its X-Forwarded-For is replaced by what was seen.
    assert seen["x-forwarded-for"] == "127.0.0.1"
    assert "for=127.0.0.1" in seen["forwarded"]
    assert seen["host"] == upstream.url.removeprefix("http://")
    assert seen["host"] != gateway.url.removeprefix("http://")


async def test_forward_key_default_sends_the_operation_id(
    gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    """By default the upstream sees the operation's id (the one the lookup reports), never
    the caller's key, also when the key came as an sf-string."""
    assert (await gateway.post("/tickets/a", key="opid-1", data=b"1")).status == 201
    assert (await gateway.post("/tickets/b", key='"abc"', data=b"2")).status == 201
    ids = []
    for key in ("opid-1", "abc"):
        lookup = await gateway.get(f"/operations/{key}")
        assert lookup.status == 200
        ids.append((await lookup.json())["id"])

    assert upstream.count == 2
    assert all(operation_id.startswith("op_") for operation_id in ids)
    assert [effect.key for effect in upstream.effects] == ids


async def test_forward_key_key_sends_the_normalized_key(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """With forward_key = "key" (one scope) the upstream sees the normalized key."""
    gateway = await gateway_factory(
        upstream.url,
        route={"forward_key": "key"},
        idempotency={"scope_headers": [], "shared_scope": True},
    )
    assert (await gateway.post("/tickets/a", key="bare-key", data=b"1")).status == 201
    assert (await gateway.post("/tickets/b", key='"abc"', data=b"2")).status == 201

    assert upstream.count == 2
    assert [effect.key for effect in upstream.effects] == ["bare-key", "abc"]


async def test_forward_key_false_sends_no_key(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """With forward_key = false the upstream sees no Idempotency-Key, whatever its spelling."""
    gateway = await gateway_factory(upstream.url, route={"forward_key": False})

    assert (await gateway.post("/tickets/a", key="nofwd-1", data=b"1")).status == 201
    response = await gateway.post("/tickets/a", data=b"2", headers={"idempotency-key": "nofwd-2"})
    assert response.status == 201

    assert upstream.count == 2
    for effect in upstream.effects:
        assert "idempotency-key" not in effect.headers


async def test_caller_key_header_is_replaced_not_duplicated(
    gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    """The caller's key header, however spelled, is replaced by one gateway-set forwarded key."""
    ids = []
    for name, key in (("Idempotency-Key", "same-case"), ("idempotency-key", "lower-case")):
        response = await gateway.post("/tickets/a", data=b"1", headers={name: f'"{key}"'})
        assert response.status == 201
        assert response.headers["Idempotency-Key"] == key
        ids.append((await (await gateway.get(f"/operations/{key}")).json())["id"])

    assert upstream.count == 2
    for effect in upstream.effects:
        assert effect.headers["idempotency-key"] == effect.key  # one header, not two joined
    assert [effect.key for effect in upstream.effects] == ids


async def test_redirect_is_passed_back_not_followed(
    gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    """A 302 is an answer like any other: returned with its Location, stored and replayed."""
    url = f"{gateway.url}/tickets/v1/issues?redirect=http://127.0.0.1:1/elsewhere"
    responses = []
    for _ in range(2):
        response = await gateway.session.post(
            url, data=b"x", headers={"Idempotency-Key": "redir-1"}, allow_redirects=False
        )
        await response.read()
        responses.append(response)
    first, retry = responses

    for response in responses:
        assert response.status == 302
        assert response.headers["Location"] == "http://127.0.0.1:1/elsewhere"
    assert "Idempotent-Replayed" not in first.headers
    assert retry.headers["Idempotent-Replayed"] == "true"
    assert upstream.count == 1


async def test_gzip_body_passed_back_compressed_and_replayed_identically(
    gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    """A gzip body is neither decompressed nor re-encoded, first time or on replay."""
    first = await gateway.post("/tickets/v1/issues?gzip=1", key="gz-1", data=b"x")
    retry = await gateway.post("/tickets/v1/issues?gzip=1", key="gz-1", data=b"x")

    raw = await first.read()
    assert first.status == 201
    assert first.headers["Content-Encoding"] == "gzip"
    assert json.loads(gzip.decompress(raw))["effect"] == 1
    assert retry.headers["Idempotent-Replayed"] == "true"
    assert retry.headers["Content-Encoding"] == "gzip"
    assert await retry.read() == raw
    assert upstream.count == 1


async def test_set_cookie_is_not_replayed(
    gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    """Set-Cookie reaches the first caller only; other headers are replayed."""
    first = await gateway.post("/tickets/v1/issues?cookie=1", key="ck-1", data=b"x")
    retry = await gateway.post("/tickets/v1/issues?cookie=1", key="ck-1", data=b"x")

    assert first.headers["Set-Cookie"] == "session=secret"
    assert first.headers["X-Custom"] == "yes"
    assert retry.headers["Idempotent-Replayed"] == "true"
    assert "Set-Cookie" not in retry.headers
    assert retry.headers["X-Custom"] == "yes"
    assert upstream.count == 1


async def test_configured_redactions_are_not_replayed(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """`redact_response_headers` drops the named headers from the receipt, Set-Cookie still."""
    gateway = await gateway_factory(upstream.url, route={"redact_response_headers": ["x-custom"]})
    first = await gateway.post("/tickets/v1/issues?cookie=1", key="ck-2", data=b"x")
    retry = await gateway.post("/tickets/v1/issues?cookie=1", key="ck-2", data=b"x")

    assert first.headers["X-Custom"] == "yes"
    assert retry.headers["Idempotent-Replayed"] == "true"
    assert "X-Custom" not in retry.headers
    assert "Set-Cookie" not in retry.headers
    assert upstream.count == 1


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE"])
async def test_unprotected_methods_pass_through_without_records(
    gateway: RunningGateway, upstream: CountingUpstream, method: str
) -> None:
    """Methods the route does not protect reach the upstream every time and leave no record;
    the key they carried is answered `not-protected` (tests/test_not_protected.py)."""
    for _ in range(2):
        response = await gateway.session.request(
            method, f"{gateway.url}/tickets/v1/issues/1", headers={"Idempotency-Key": "pt-1"}
        )
        await response.read()
        assert response.status == 200
        assert response.headers.getall("Idempotency-Status") == ["not-protected"]
        assert "Idempotent-Replayed" not in response.headers

    assert upstream.count == 2
    assert [effect.method for effect in upstream.effects] == [method, method]
    lookup = await gateway.get("/operations/pt-1")
    await problem_of(lookup, 404, "unknown-key")


@pytest.mark.parametrize("method", ["GET", "PUT"])
async def test_pass_through_is_never_resent(
    gateway: RunningGateway, upstream: CountingUpstream, method: str
) -> None:
    """A dropped connection on an idempotent method is a 502, not a silent second effect."""
    warm = await gateway.session.request(method, f"{gateway.url}/tickets/warm")
    await warm.read()
    assert warm.status == 200

    response = await gateway.session.request(
        method, f"{gateway.url}/tickets/v1/issues/1?drop=after_effect"
    )
    await problem_of(response, 502, "upstream-connection-lost")
    assert upstream.count == 2
    assert [effect.query for effect in upstream.effects] == ["", "drop=after_effect"]


async def test_require_key_false_passes_keyless_posts_through(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """Without require_key, a keyless POST is proxied each time; a keyed one is still protected."""
    gateway = await gateway_factory(upstream.url, route={"require_key": False})

    for _ in range(2):
        response = await gateway.post("/tickets/v1/issues", data=b"x")
        assert response.status == 201
        assert "Idempotency-Status" not in response.headers
    assert upstream.count == 2

    first = await gateway.post("/tickets/v1/issues", key="rk-1", data=b"x")
    retry = await gateway.post("/tickets/v1/issues", key="rk-1", data=b"x")
    assert first.status == retry.status == 201
    assert retry.headers["Idempotent-Replayed"] == "true"
    assert await retry.read() == await first.read()
    assert upstream.count == 3


async def test_body_over_max_body_is_refused_with_content_length(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """A declared body over the route's max_body is a 413 and never reaches the upstream."""
    gateway = await gateway_factory(upstream.url, route={"max_body": "1KiB"})

    response = await gateway.post("/tickets/v1/issues", key="big-1", data=b"x" * 1025)
    await problem_of(response, 413, "payload-too-large")
    assert (await gateway.post("/tickets/v1/issues", key="ok-1", data=b"x" * 1024)).status == 201
    assert upstream.count == 1


async def test_body_over_max_body_is_refused_when_chunked(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """A chunked body that grows past max_body is a 413 and never reaches the upstream."""
    gateway = await gateway_factory(upstream.url, route={"max_body": "1KiB"})

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(4):
            yield b"y" * 512

    response = await gateway.session.post(
        f"{gateway.url}/tickets/v1/issues",
        data=chunks(),
        headers={"Idempotency-Key": "big-2"},
    )
    await response.read()
    assert response.request_info.headers["Transfer-Encoding"] == "chunked"
    await problem_of(response, 413, "payload-too-large")
    assert upstream.count == 0


FORGED = {
    "X-Forwarded-For": "10.0.0.1",
    "Forwarded": "for=10.0.0.1;proto=https",
    "X-Forwarded-Host": "admin.internal",
    "X-Forwarded-Proto": "https",
}


@pytest.mark.parametrize(("trusted", "kept"), [((), False), (("127.0.0.0/8",), True)])
async def test_forwarding_headers_are_passed_on_only_from_a_trusted_proxy(
    gateway_factory: GatewayFactory,
    upstream: CountingUpstream,
    trusted: tuple[str, ...],
    kept: bool,
) -> None:
    """A caller's own `X-Forwarded-For: 10.0.0.1` would pass for an internal address
    upstream (security review, finding 8): unless it comes from `[server]
    trusted_proxies`, what the gateway saw replaces all four headers; from a trusted
    proxy they are passed on, with this hop appended."""
    gateway = await gateway_factory(upstream.url, server={"trusted_proxies": list(trusted)})
    response = await gateway.post(
        "/tickets/v1/issues", key="fwd-1", json_body={"a": 1}, headers=FORGED
    )
    assert response.status == 201
    seen = upstream.effects[0].headers
    if kept:
        assert seen["x-forwarded-for"] == "10.0.0.1, 127.0.0.1"
        assert seen["forwarded"].startswith("for=10.0.0.1;proto=https, for=127.0.0.1")
        assert seen["x-forwarded-host"] == "admin.internal"
        assert seen["x-forwarded-proto"] == "https"
    else:
        assert seen["x-forwarded-for"] == "127.0.0.1"
        assert seen["forwarded"].startswith("for=127.0.0.1;")
        assert "10.0.0.1" not in seen["forwarded"]
        assert seen["x-forwarded-host"] != "admin.internal"
        assert seen["x-forwarded-proto"] == "http"


async def _answer_after_interim_responses(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """A tool API that sends 103 Early Hints (three) and 102 Processing, then its answer."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    await reader.readexactly(length)
    writer.write(b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n" * 3)
    writer.write(b"HTTP/1.1 102 Processing\r\n\r\n")
    writer.write(
        b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 11\r\n"
        b"Connection: close\r\n\r\n" + b'{"id":"T1"}'
    )
    await writer.drain()
    writer.close()


async def test_interim_responses_before_the_answer_do_not_make_it_unknown(
    gateway_factory: GatewayFactory,
) -> None:
    """103 Early Hints and 102 Processing are not the answer (security review, finding 8):
    the final 201 is the receipt, the operation `completed`, and a retry replays it."""
    server = await asyncio.start_server(_answer_after_interim_responses, "127.0.0.1", 0)
    try:
        port = server.sockets[0].getsockname()[1]
        gateway = await gateway_factory(f"http://127.0.0.1:{port}")
        first = await gateway.post("/tickets/v1/issues", key="eh-1", json_body={"a": 1})
        assert (first.status, first.headers["Idempotency-Status"]) == (201, "completed")
        assert await first.read() == b'{"id":"T1"}'
        again = await gateway.post("/tickets/v1/issues", key="eh-1", json_body={"a": 1})
        assert again.headers["Idempotent-Replayed"] == "true"
        assert "link" not in {name.lower() for name in first.headers}
    finally:
        server.close()
        await server.wait_closed()
