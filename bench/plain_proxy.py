"""The baseline: the least an aiohttp reverse proxy can do, with no idempotency at all.

The gateway is an aiohttp server plus an aiohttp client plus its own work, so
the fair yardstick for "its own work" is this proxy, measured in the same run:
one shared `ClientSession`, read the whole body, forward it, return status,
headers and body. No streaming, no retries, no routing, no logging.

Run it with::

    python -m bench.plain_proxy --port 0 --upstream http://127.0.0.1:9000
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import AsyncIterator, Sequence

import aiohttp
from aiohttp import web

__all__ = ["create_app", "main"]

HOP_BY_HOP = frozenset(
    {
        "connection",  # this hop's connection management, not the message's
        "keep-alive",  # likewise
        "proxy-connection",  # a non-standard spelling of Connection
        "te",  # what this hop accepts as transfer codings
        "trailer",  # trailers are not forwarded
        "transfer-encoding",  # framing: aiohttp re-frames the body it sends
        "upgrade",  # a proxy that does not tunnel must not pass it on
        "content-length",  # framing: recomputed from the body actually sent
        "host",  # names this proxy; the client session sets the upstream's
    }
)
"""Headers that describe one hop, not the message: never copied across the proxy."""

UPSTREAM = web.AppKey("upstream", str)
SESSION = web.AppKey("session", aiohttp.ClientSession)


def create_app(upstream: str) -> web.Application:
    """A proxy that sends every request to `upstream` + the same path and query.

    >>> app = create_app("http://127.0.0.1:9000")
    """
    app = web.Application()
    app[UPSTREAM] = upstream.rstrip("/")
    app.cleanup_ctx.append(_session)
    app.router.add_route("*", "/{tail:.*}", _forward)
    return app


async def _session(app: web.Application) -> AsyncIterator[None]:
    # The same pool size and client options as the gateway's forwarder (its
    # default route max_concurrency is 256), so the two differ only in their work.
    connector = aiohttp.TCPConnector(limit=256)
    async with aiohttp.ClientSession(
        connector=connector, auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar()
    ) as session:
        app[SESSION] = session
        yield


async def _forward(request: web.Request) -> web.Response:
    body = await request.read()
    # Lists of pairs, not dicts: a repeated header (Set-Cookie, Via) must survive.
    headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP]
    url = request.app[UPSTREAM] + request.rel_url.raw_path_qs
    async with request.app[SESSION].request(
        request.method, url, headers=headers, data=body, allow_redirects=False
    ) as upstream:
        payload = await upstream.read()
        reply_headers = [(k, v) for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP]
        return web.Response(status=upstream.status, headers=reply_headers, body=payload)


async def _serve(host: str, port: int, upstream: str) -> None:
    runner = web.AppRunner(create_app(upstream), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        bound_host, bound_port = runner.addresses[0][:2]
        print(f"plain proxy listening on http://{bound_host}:{bound_port}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()


def _use_uvloop() -> None:
    """The gateway's rule (`gateway.web.serve`): uvloop when installed, so both run on one loop."""
    try:
        import uvloop  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def main(argv: Sequence[str] | None = None) -> int:
    """Serve the proxy until SIGINT or SIGTERM."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.plain_proxy", description="A minimal aiohttp reverse proxy."
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port; 0 lets the OS choose")
    parser.add_argument("--upstream", required=True, help="base URL, e.g. http://127.0.0.1:9000")
    args = parser.parse_args(argv)
    _use_uvloop()
    asyncio.run(_serve(args.host, args.port, args.upstream))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
