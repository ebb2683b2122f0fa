"""Malformed HTTP on a raw socket: refused or hung up on, never forwarded, never recorded.

Every case sends a protected request (`POST` with a fresh, valid key) whose
only fault is its framing or its header bytes, so that forwarding it would be
the gateway's mistake and not the test's. The gateway may answer 4xx (the
HTTP parser's plain 400 counts, as the contract allows) or close the connection;
afterwards it must answer /healthz, the upstream must have seen nothing and
the key must have no record. Every socket read is bounded (`rawhttp`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import logging
import time

import pytest
import pytest_asyncio
from conftest import GatewayFactory
from harness import RunningGateway
from hostile import assert_healthy, assert_no_record, problem_type, record_count
from rawhttp import RawResponse, address_of, exchange, read_response, request
from upstream import CountingUpstream

KEY = "malformed-1"
MAX_BODY = 1024
HEAD = (
    b"POST /tickets/v1/issues HTTP/1.1\r\nHost: gateway.test\r\n"
    b"Idempotency-Key: " + KEY.encode() + b"\r\nContent-Type: application/json\r\n"
)
CHUNKED = HEAD + b"Transfer-Encoding: chunked\r\n"
SETTLE = 0.3
"""Seconds for the gateway to notice a hang-up before the test looks for effects."""


@pytest_asyncio.fixture
async def small(gateway_factory: GatewayFactory, upstream: CountingUpstream) -> RunningGateway:
    """A gateway whose route takes bodies of at most 1 KiB."""
    return await gateway_factory(upstream.url, route={"max_body": f"{MAX_BODY}B"})


async def assert_nothing_happened(gateway: RunningGateway, upstream: CountingUpstream) -> None:
    await assert_healthy(gateway)
    assert upstream.count == 0, upstream.effects
    await assert_no_record(gateway, KEY)
    assert await record_count(gateway) == 0


def assert_refused(response: RawResponse, *also: int) -> None:
    """A 4xx (or one of `also`), or a connection closed without an answer."""
    if response.status is not None:
        assert 400 <= response.status < 500 or response.status in also, (
            response.status,
            response.body[:300],
        )


MALFORMED = [
    pytest.param(CHUNKED + b"\r\nzz\r\nabc\r\n0\r\n\r\n", id="invalid-chunk-size"),
    pytest.param(CHUNKED + b"\r\n-3\r\nabc\r\n0\r\n\r\n", id="negative-chunk-size"),
    pytest.param(CHUNKED + b"\r\nffffffffffffffffff\r\nabc\r\n0\r\n\r\n", id="chunk-size-overflow"),
    pytest.param(CHUNKED + b"\r\n3\r\nabcdef\r\n0\r\n\r\n", id="chunk-longer-than-its-size"),
    pytest.param(CHUNKED + b"\r\n3\nabc\n0\n\n", id="chunk-lines-without-cr"),
    pytest.param(
        HEAD + b"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        id="content-length-then-transfer-encoding",
    ),
    pytest.param(
        CHUNKED + b"Content-Length: 3\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        id="transfer-encoding-then-content-length",
    ),
    pytest.param(
        HEAD + b"Content-Length: 3\r\nContent-Length: 4\r\n\r\nabcd", id="two-content-lengths"
    ),
    pytest.param(HEAD + b"Content-Length: 3, 4\r\n\r\nabcd", id="content-length-list"),
    pytest.param(HEAD + b"Content-Length: -1\r\n\r\nabc", id="negative-content-length"),
    pytest.param(HEAD + b"Content-Length: +3\r\n\r\nabc", id="signed-content-length"),
    pytest.param(HEAD + b"Content-Length: 0x3\r\n\r\nabc", id="hex-content-length"),
    pytest.param(
        CHUNKED + b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        id="transfer-encoding-twice",
    ),
    pytest.param(
        HEAD + b"Transfer-Encoding: xchunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        id="unknown-transfer-encoding",
    ),
    pytest.param(
        HEAD + b"Transfer-Encoding: chunked, gzip\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        id="chunked-not-last",
    ),
    pytest.param(HEAD + b"X-Evil: a\x00b\r\nContent-Length: 2\r\n\r\n{}", id="nul-in-value"),
    pytest.param(
        HEAD.replace(KEY.encode(), KEY.encode() + b"\x00") + b"Content-Length: 2\r\n\r\n{}",
        id="nul-in-key",
    ),
    pytest.param(HEAD + b"X-Evil\x00: a\r\nContent-Length: 2\r\n\r\n{}", id="nul-in-name"),
    pytest.param(HEAD + b"X-Evil: a\rb\r\nContent-Length: 2\r\n\r\n{}", id="bare-cr-in-value"),
    pytest.param(HEAD + b"X-Evil: a\nContent-Length: 2\r\n\r\n{}", id="bare-lf-line-end"),
    pytest.param(HEAD + b"X-\xc3\xa9vil: a\r\nContent-Length: 2\r\n\r\n{}", id="non-ascii-name"),
    pytest.param(HEAD + b"X-Evil : a\r\nContent-Length: 2\r\n\r\n{}", id="space-before-colon"),
    pytest.param(HEAD + b"X-Evil a\r\nContent-Length: 2\r\n\r\n{}", id="header-without-colon"),
    pytest.param(HEAD + b"X-Evil: a\r\n b\r\nContent-Length: 2\r\n\r\n{}", id="obs-fold"),
    pytest.param(
        HEAD + b"X-Big: " + b"a" * 100_000 + b"\r\nContent-Length: 2\r\n\r\n{}",
        id="100kb-header",
    ),
    pytest.param(
        HEAD.replace(b"/v1/issues", b"/v1/" + b"a" * 100_000) + b"Content-Length: 2\r\n\r\n{}",
        id="100kb-request-line",
    ),
    pytest.param(
        HEAD + b"".join(b"X-H%d: v\r\n" % n for n in range(500)) + b"Content-Length: 2\r\n\r\n{}",
        id="500-headers",
    ),
    pytest.param(HEAD + b"Content-Length: 10737418240\r\n\r\n{}", id="declared-10gib-body"),
]


@pytest.mark.parametrize("data", MALFORMED)
async def test_malformed_request_is_refused_and_not_forwarded(
    small: RunningGateway, upstream: CountingUpstream, data: bytes
) -> None:
    """Bad framing or header bytes get a 4xx or a hang-up, and leave no effect and no record."""
    response = await exchange(address_of(small.url), data)
    assert_refused(response)
    await assert_nothing_happened(small, upstream)


# Fixed: `Transfer-Encoding: gzip, chunked` is accepted; only the chunked framing is
# removed and the still-gzipped bytes are forwarded as the plain body (the header is
# hop-by-hop and dropped). RFC 9112 6.1: a transfer coding the server does not
# understand gets 501; a refusal (4xx or 501) is what we expect.
async def test_unsupported_transfer_coding_is_refused(
    small: RunningGateway, upstream: CountingUpstream
) -> None:
    """A transfer coding other than chunked is refused (4xx or 501), never forwarded as is."""
    coded = gzip.compress(b'{"a": 1}', mtime=0)
    data = (
        HEAD
        + b"Transfer-Encoding: gzip, chunked\r\n\r\n%x\r\n" % len(coded)
        + coded
        + b"\r\n0\r\n\r\n"
    )
    response = await exchange(address_of(small.url), data)
    assert_refused(response, 501)
    await assert_nothing_happened(small, upstream)


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(CHUNKED + b"\r\n3\r\nabc\r\n", id="chunked-without-final-chunk"),
        pytest.param(HEAD + b'Content-Length: 100\r\n\r\n{"partial": ', id="short-body"),
        pytest.param(HEAD + b"Content-Length: 100\r\n", id="unfinished-head"),
    ],
)
async def test_request_cut_off_by_a_hang_up_is_never_forwarded(
    small: RunningGateway, upstream: CountingUpstream, data: bytes
) -> None:
    """A caller that closes before its request is complete causes no effect and no record."""
    _, writer = await asyncio.open_connection(*address_of(small.url))
    writer.write(data)
    await writer.drain()
    await asyncio.sleep(0.05)
    writer.close()
    await writer.wait_closed()
    await asyncio.sleep(SETTLE)
    await assert_nothing_happened(small, upstream)


# Fixed (gateway/proxy/view.py read_body + gateway/web/problems.py problem_middleware): the
# ConnectionResetError from reading the body of a caller that hung up is not a
# GatewayError, so it is logged as "unexpected error" with a traceback and the
# request log records a 500; any client can fill the error log this way.
async def test_caller_hanging_up_mid_body_is_not_an_internal_error(
    small: RunningGateway, upstream: CountingUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    """A caller gone mid-body is an ordinary event: no ERROR record from the gateway's loggers."""
    caplog.set_level(logging.INFO, logger="gateway")
    _, writer = await asyncio.open_connection(*address_of(small.url))
    writer.write(HEAD + b'Content-Length: 100\r\n\r\n{"partial": ')
    await writer.drain()
    await asyncio.sleep(0.05)
    writer.close()
    await writer.wait_closed()
    await asyncio.sleep(SETTLE)
    await assert_nothing_happened(small, upstream)
    errors = [
        f"{record.name}: {record.getMessage()}"
        for record in caplog.records
        if record.name.startswith("gateway") and record.levelno >= logging.ERROR
    ]
    assert errors == []


async def test_endless_chunked_body_is_cut_at_max_body(
    small: RunningGateway, upstream: CountingUpstream
) -> None:
    """Chunks streamed for 2 s to a 1 KiB route get an early 413 (or a hang-up), never forwarded."""
    reader, writer = await asyncio.open_connection(*address_of(small.url))
    started = time.monotonic()
    answer = asyncio.create_task(read_response(reader))
    chunk = b"%x\r\n%s\r\n" % (256, b"x" * 256)
    try:
        writer.write(CHUNKED + b"\r\n")
        while time.monotonic() - started < 2.0:
            writer.write(chunk)
            await writer.drain()
            await asyncio.sleep(0.01)
    except ConnectionError:
        pass  # the gateway hung up on the endless body: also a refusal
    finally:
        response = await asyncio.wait_for(answer, 60)  # bounds a hang only
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    assert_refused(response)
    if response.status is not None:
        assert response.status == 413
        assert problem_type(response) == "payload-too-large"
    # The body never ends (no last chunk): a gateway that waited for its end would have
    # answered 408 once the chunks stopped, never 413. How soon it answered is the load's.
    await assert_nothing_happened(small, upstream)


async def test_declared_oversized_body_is_refused_before_it_is_sent(
    small: RunningGateway, upstream: CountingUpstream
) -> None:
    """A Content-Length over max_body gets 413 at once, while the body is still unsent."""
    reader, writer = await asyncio.open_connection(*address_of(small.url))
    try:
        writer.write(HEAD + b"Content-Length: %d\r\n\r\n" % (MAX_BODY * 1024))
        await writer.drain()
        response = await read_response(reader)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    assert response.status == 413
    await assert_nothing_happened(small, upstream)


# Fixed (gateway/web/serve.py make_runner): the server's auto_decompress is left on, so a
# request body with `Content-Encoding: gzip` is inflated by aiohttp before the
# gateway reads it. Pinned: invalid gzip is never a gateway 500 (the bytes are
# forwarded as sent, like any body).
@pytest.mark.parametrize("method", ["POST", "GET"])
async def test_invalid_compressed_body_is_not_an_internal_error(
    small: RunningGateway, upstream: CountingUpstream, method: str
) -> None:
    """A body that is not the gzip its Content-Encoding claims never gets a gateway 500."""
    key = KEY if method == "POST" else None
    headers = [("Content-Encoding", "gzip")] + ([("Idempotency-Key", key)] if key else [])
    response = await exchange(
        address_of(small.url),
        request(method, "/tickets/v1/issues", headers, b"this is not gzip"),
    )
    assert response.status is not None
    assert problem_type(response) != "internal-error", response.body[:300]
    # The gateway forwards the bytes as sent; the counting upstream itself cannot
    # decode them and may answer 500, which the gateway passes back as it came.
    assert response.status < 500 or problem_type(response) is None, response.body[:300]
    await assert_healthy(small)


# Fixed (same cause): a valid gzip body is forwarded inflated but still labelled
# `Content-Encoding: gzip`, so the upstream gets bytes that contradict their header
# (the counting upstream fails to decode them and answers 500). The contract: the
# gateway never decompresses bodies.
async def test_compressed_body_is_forwarded_as_sent(
    small: RunningGateway, upstream: CountingUpstream
) -> None:
    """A gzip request body reaches the upstream still compressed, matching its Content-Encoding."""
    plain = b'{"title": "compressed"}'
    response = await exchange(
        address_of(small.url),
        request(
            "POST",
            "/tickets/v1/issues",
            [("Idempotency-Key", KEY), ("Content-Encoding", "gzip")],
            gzip.compress(plain, mtime=0),
        ),
    )
    assert response.status == 201, response.body[:300]
    assert upstream.count == 1
    # The counting upstream inflates what it receives: only a compressed body decodes.
    assert upstream.effects[0].body == plain
