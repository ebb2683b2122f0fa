"""A counting upstream: the tool API that gateway tests put behind the gateway.

The gateway's whole promise is "at most one effect per key", so tests need an
upstream that counts effects rather than one that merely answers. Every request
that reaches the handler is one effect, recorded with what the upstream saw
(method, path, query, headers, body, and the ``Idempotency-Key`` it received).

Tests script the upstream through query parameters, because the gateway
forwards the query string unchanged and a test can then drive the upstream
through the gateway without any side channel:

- ``status=N``: answer with status N (default 201 for POST, 200 otherwise);
- ``delay=SECONDS``: apply the effect, then wait before answering, like a slow
  API that has already done the work;
- ``drop=after_effect``: apply the effect, then close the connection without
  a response (the ambiguous case: sent, no answer);
- ``drop=before_effect``: close the connection without applying anything (to
  the gateway as ambiguous as the above: it cannot tell them apart);
- ``drop=mid_body``: send the headers and half of a body announced by a larger
  ``Content-Length``, then close (connection lost mid-response);
- ``size=N``: answer with N bytes of a deterministic pattern;
- ``trickle=SECONDS``: send the body in 64 KiB chunks, SECONDS apart (a large
  answer that takes a while, so a client can leave in the middle);
- ``redirect=URL``: answer 302 with ``Location: URL`` (a proxy must not follow);
- ``gzip=1``: answer with a gzip-compressed body and ``Content-Encoding: gzip``
  (a proxy must not decompress);
- ``cookie=1``: add ``Set-Cookie: session=secret`` and ``X-Custom: yes``;
- ``echo=1``: answer with the request body, byte for byte;
- ``token=1``: add ``X-Upstream-Token: tok-9f8e7d6c5b``;
- ``forge=1``: add the gateway's own headers (``Idempotent-Replayed: true``,
  ``Idempotency-Status: completed``, ``Idempotency-Key: forged``);
- ``apply_after=SECONDS``: wait first, then apply the effect and answer (an
  upstream that applies a request late, after the caller timed out);
- ``hold=1``: wait until the test calls ``release_held()``, then apply the
  effect and answer (late by as long as the test says, whatever the load);
- ``hold_answer=1``: apply the effect, then answer only once the test calls
  ``release_answers()`` (or stops the upstream): a slow API whose answer no
  load can bring in before the test is ready for it.

A retry must be the same request, query included, so attempts of one key
cannot be told apart by their query: ``script`` holds controls for the next
requests, one dict per request, taken in order and applied over the query's.

``GET /effects/<key>`` is the probe endpoint: 200 with the effect's JSON when
an effect arrived with that ``Idempotency-Key``, else 404. Probes are recorded
in ``probes``, never counted as effects. ``probe_holds`` holds events for the
next probes, in order: the answer is decided when the probe arrives, then held
until the test sets the event (a slow probe that answers about the past, for
as long as the test needs, whatever the load).

The default body is JSON describing the effect, and every response carries
``X-Effect-Id`` so a test can tell which effect a (replayed) response came from.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, Self

from aiohttp import web

if TYPE_CHECKING:
    from types import TracebackType

__all__ = ["CountingUpstream", "Effect", "UpstreamFactory", "effects_probe", "serve_mcp_handlers"]

HOST = "127.0.0.1"

# A pattern rather than one repeated byte, so a shifted or truncated body
# cannot pass a byte-for-byte comparison by accident.
_PATTERN = b"0123456789abcdefghijklmnopqrstuvwxyz\n"

# Statuses that must not carry a body (RFC 9110); aiohttp refuses to send one.
_BODYLESS = frozenset({204, 304})


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@contextlib.asynccontextmanager
async def serve_mcp_handlers(post: Handler, get: Handler) -> AsyncIterator[str]:
    """Serve `post` and `get` at ``/mcp`` on 127.0.0.1 (a port the OS chooses): a scripted
    MCP server's URL, for as long as the block runs."""
    app = web.Application()
    app.router.add_post("/mcp", post)
    app.router.add_get("/mcp", get)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        site = web.TCPSite(runner, HOST, 0)
        await site.start()
        yield f"http://{HOST}:{runner.addresses[0][1]}/mcp"
    finally:
        await runner.cleanup()


def effects_probe(
    *,
    by: str = "forwarded_key",
    not_applied_after: str = "1s",
    applies_to: tuple[str, ...] = ("POST /v1/issues",),
) -> dict[str, object]:
    """A route's `[routes.probe]` table that asks this upstream's `GET /effects/<key>`.

    `by` names what the path carries (`forwarded_key` or `operation_id`): 200 means the
    effect arrived (applied), 404 that it did not (not applied, once the last send is
    `not_applied_after` past the call's whole window). It sees every effect of every
    caller (`sees_all_callers`), and is declared for `applies_to` (by default the
    `POST /v1/issues` the tests send): a 404 releases only what that covers, once the
    probe is calibrated (`harness.calibration_sample`).
    """
    return {
        "path": f"/effects/{{{by}}}",
        "applied_statuses": [200],
        "not_applied_statuses": [404],
        "not_applied_after": not_applied_after,
        "applies_to": list(applies_to),
        "sees_all_callers": True,
    }


@dataclass(frozen=True)
class Effect:
    """One request that reached the upstream's handler.

    Header names are lower-cased and repeated headers are joined with ``", "``,
    so tests can look them up without caring how the gateway spelled them.

    >>> effect.key, effect.headers["content-type"]
    ('run-1:0:c1', 'application/json')
    """

    number: int
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes
    key: str | None
    raw_path: str = ""
    """The path exactly as it arrived, percent-escapes and all."""


class CountingUpstream:
    """A real aiohttp server on 127.0.0.1 that records every effect it applies.

    >>> async with CountingUpstream(keepalive_timeout=0.5) as upstream:
    ...     ...  # send requests to f"{upstream.url}/v1/issues?status=500"
    ...     assert upstream.count_for("run-1:0:c1") == 1
    """

    def __init__(self, *, keepalive_timeout: float = 75.0, shutdown_timeout: float = 1.0) -> None:
        if keepalive_timeout < 0:
            raise ValueError(f"keepalive_timeout must be >= 0, got {keepalive_timeout!r}")
        if shutdown_timeout < 0:
            raise ValueError(f"shutdown_timeout must be >= 0, got {shutdown_timeout!r}")
        self._keepalive_timeout = keepalive_timeout
        self._shutdown_timeout = shutdown_timeout
        self.effects: list[Effect] = []
        self.probes: list[dict[str, str]] = []
        self.script: list[dict[str, str]] = []
        self.probe_holds: list[asyncio.Event] = []
        self.held = 0
        """How many ``hold=1`` requests arrived (they wait for ``release_held``)."""
        self.per_principal = False
        """Like an API that shows each account only its own records: a probe finds only the
        effects that arrived with the probe's own ``Authorization``."""
        self._release = asyncio.Event()
        self._answer = asyncio.Event()
        # Holding the transports (not their ids) keeps ids from being reused by
        # a new connection after an old one is garbage-collected.
        self._transports: set[object] = set()
        self._changed = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._url: str | None = None

    @property
    def url(self) -> str:
        """The base URL, without a trailing slash, e.g. ``http://127.0.0.1:41234``."""
        if self._url is None:
            raise RuntimeError("CountingUpstream is not started")
        return self._url

    @property
    def count(self) -> int:
        """How many effects were applied since the start (or the last reset)."""
        return len(self.effects)

    @property
    def connections(self) -> int:
        """How many distinct TCP connections carried a request to the handler."""
        return len(self._transports)

    def count_for(self, key: str) -> int:
        """How many effects arrived with this forwarded ``Idempotency-Key`` value (see
        ``harness.effects_for_key`` to count by the caller's key)."""
        return sum(1 for effect in self.effects if effect.key == key)

    def reset(self) -> None:
        """Forget the recorded effects and connections (the server keeps running)."""
        self.effects.clear()
        self._transports.clear()

    def release_held(self) -> None:
        """Let every ``hold=1`` request, waiting or still to come, apply its effect."""
        self._release.set()

    def release_answers(self) -> None:
        """Let every ``hold_answer=1`` request, waiting or still to come, send its answer."""
        self._answer.set()

    async def wait_for_held(self, count: int, *, seconds: float = 30.0) -> None:
        """Wait until ``count`` ``hold=1`` requests arrived; TimeoutError after ``seconds``."""
        async with asyncio.timeout(seconds):
            while self.held < count:
                self._changed.clear()
                await self._changed.wait()

    async def wait_for_effects(self, count: int, *, seconds: float = 30.0) -> None:
        """Wait until ``count`` effects were applied; TimeoutError after ``seconds``."""
        async with asyncio.timeout(seconds):
            while len(self.effects) < count:
                self._changed.clear()
                await self._changed.wait()

    async def wait_for_probes(self, count: int, *, seconds: float = 30.0) -> None:
        """Wait until ``count`` probes arrived; TimeoutError after ``seconds``."""
        async with asyncio.timeout(seconds):
            while len(self.probes) < count:
                self._changed.clear()
                await self._changed.wait()

    async def wait_for_count(self, count: int, *, seconds: float = 30.0) -> None:
        """Wait until at least ``count`` effects were applied; TimeoutError after ``seconds``
        (a bound on a hang only: an effect that comes is waited for as long as it takes).

        For tests where the effect happens behind the client's back, e.g. after
        the caller disconnected from the gateway.
        """
        async with asyncio.timeout(seconds):
            while self.count < count:
                self._changed.clear()
                await self._changed.wait()

    async def start(self) -> None:
        """Listen on 127.0.0.1 on a port the OS chooses."""
        if self._runner is not None:
            raise RuntimeError("CountingUpstream is already started")
        app = web.Application()
        app.router.add_get("/effects/{key}", self._probe)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(
            app,
            keepalive_timeout=self._keepalive_timeout,
            shutdown_timeout=self._shutdown_timeout,
            access_log=None,
        )
        await runner.setup()
        try:
            await web.TCPSite(runner, HOST, 0).start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        port = runner.addresses[0][1]
        self._url = f"http://{HOST}:{port}"

    async def stop(self) -> None:
        """Stop listening and close every connection; safe to call twice."""
        self._answer.set()  # the held answers' callers are gone or done: let the handlers end
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def __repr__(self) -> str:
        return f"<CountingUpstream url={self._url!r} count={self.count}>"

    async def _probe(self, request: web.Request) -> web.Response:
        self.probes.append({name.lower(): value for name, value in request.headers.items()})
        self._changed.set()
        key = request.match_info["key"]
        hold = self.probe_holds.pop(0) if self.probe_holds else None
        asking = request.headers.get("Authorization")
        found = next(
            (
                effect
                for effect in self.effects
                if effect.key == key
                and (not self.per_principal or effect.headers.get("authorization") == asking)
            ),
            None,
        )
        if hold is not None:
            await hold.wait()
        if found is not None:
            return web.Response(
                status=200,
                body=_describe(found).encode(),
                headers={"Content-Type": "application/json", "X-Effect-Id": str(found.number)},
            )
        return web.json_response({"error": "no such effect"}, status=404)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        controls = {**request.query, **(self.script.pop(0) if self.script else {})}
        if controls.get("drop") == "before_effect":
            _close(request)
            return web.Response(status=500)
        if "apply_after" in controls:
            await asyncio.sleep(float(controls["apply_after"]))
        if controls.get("hold") == "1":
            self.held += 1
            self._changed.set()
            await self._release.wait()
        effect = self._record(request, body)

        if "delay" in controls:
            await asyncio.sleep(float(controls["delay"]))
        if controls.get("hold_answer") == "1":  # applied; answered once the test says so
            await self._answer.wait()

        drop = controls.get("drop")
        if drop == "after_effect":
            _close(request)
            # Returning lets aiohttp find the closed transport and treat it as
            # a client disconnect, without logging a server error.
            return web.Response(status=500)

        status = int(controls.get("status", 201 if request.method == "POST" else 200))
        headers = {"X-Effect-Id": str(effect.number)}
        if "redirect" in controls:
            status = 302
            headers["Location"] = controls["redirect"]
        if controls.get("forge") == "1":  # an upstream posing as the gateway
            headers["Idempotent-Replayed"] = "true"
            headers["Idempotency-Status"] = "completed"
            headers["Idempotency-Key"] = "forged"
            headers["Idempotency-Similar"] = "/operations/forged"
            headers["Idempotency-Distinct"] = "?1"
        if controls.get("cookie") == "1":
            headers["Set-Cookie"] = "session=secret"
            headers["X-Custom"] = "yes"

        if "size" in controls:
            payload = pattern(int(controls["size"]))
            headers["Content-Type"] = "application/octet-stream"
        else:
            payload = _describe(effect).encode()
            headers["Content-Type"] = "application/json"
        if controls.get("echo") == "1":  # the request body, byte for byte
            payload = body
            headers["Content-Type"] = "application/octet-stream"
        if controls.get("token") == "1":  # a header worth keeping secret at rest
            headers["X-Upstream-Token"] = "tok-9f8e7d6c5b"
        if controls.get("gzip") == "1":
            payload = gzip.compress(payload, mtime=0)
            headers["Content-Encoding"] = "gzip"
        if status in _BODYLESS:
            payload = b""

        if drop == "mid_body":
            return await _send_truncated(request, status, headers, payload)
        if "trickle" in controls:
            return await _send_slowly(request, status, headers, payload, float(controls["trickle"]))
        return web.Response(status=status, headers=headers, body=payload)

    def _record(self, request: web.Request, body: bytes) -> Effect:
        headers: dict[str, str] = {}
        for name, value in request.headers.items():
            lowered = name.lower()
            headers[lowered] = f"{headers[lowered]}, {value}" if lowered in headers else value
        effect = Effect(
            number=len(self.effects) + 1,
            method=request.method,
            path=request.path,
            query=request.query_string,
            headers=headers,
            body=body,
            key=request.headers.get("Idempotency-Key"),
            raw_path=request.raw_path.split("?", 1)[0],
        )
        self.effects.append(effect)
        if request.transport is not None:
            self._transports.add(request.transport)
        self._changed.set()
        return effect


class UpstreamFactory(Protocol):
    """The ``upstream_factory`` fixture: starts an upstream, stopped after the test."""

    async def __call__(
        self, *, keepalive_timeout: float = 75.0, shutdown_timeout: float = 1.0
    ) -> CountingUpstream: ...


def _describe(effect: Effect) -> str:
    return json.dumps(
        {
            "effect": effect.number,
            "method": effect.method,
            "path": effect.path,
            "query": effect.query,
            "key": effect.key,
            "body": effect.body.decode("utf-8", "replace"),
        }
    )


def pattern(size: int) -> bytes:
    """`size` bytes of the deterministic pattern a `size=N` answer carries."""
    repeats = size // len(_PATTERN) + 1
    return (_PATTERN * repeats)[:size]


def _close(request: web.Request) -> None:
    if request.transport is not None:
        request.transport.close()


async def _send_truncated(
    request: web.Request, status: int, headers: dict[str, str], payload: bytes
) -> web.StreamResponse:
    """Announce the whole body, send less than half of it, then hang up."""
    # Pad a small body so there is always something to send and something missing.
    full = payload if len(payload) >= 2 else payload + pattern(64)
    response = web.StreamResponse(status=status, headers=headers)
    response.content_length = len(full)
    await response.prepare(request)
    await response.write(full[: len(full) // 2])
    _close(request)
    return response


async def _send_slowly(
    request: web.Request, status: int, headers: dict[str, str], payload: bytes, pause: float
) -> web.StreamResponse:
    """The whole body, announced up front, in 64 KiB chunks `pause` seconds apart."""
    response = web.StreamResponse(status=status, headers=headers)
    response.content_length = len(payload)
    await response.prepare(request)
    for start in range(0, len(payload), 64 * 1024):
        await response.write(payload[start : start + 64 * 1024])
        await asyncio.sleep(pause)
    await response.write_eof()
    return response
