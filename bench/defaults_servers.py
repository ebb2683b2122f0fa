"""The issue's two baselines for `bench.defaults`, on the event loop of your choice.

- `bare`: a bare aiohttp handler, the fastest any aiohttp server answers on this
  machine: any POST (any path) reads its body and gets 201 and a small JSON body.
  Nothing else: no JSON parsing, no state, no middleware, no access log.
- `proxy`: the plain aiohttp reverse proxy of `bench.plain_proxy` (its
  `create_app`, the same code `bench.run` measures) in front of `--upstream`.

`--loop asyncio` (the default here: the issue measured its baselines without
uvloop) or `--loop uvloop`. `bench.plain_proxy` run as a module always takes
uvloop when it is installed, hence this module. Each prints one "... listening
on http://HOST:PORT" line once it accepts connections (`bench.processes`
reads it) and serves until SIGINT or SIGTERM.

    python -m bench.defaults_servers bare --port 0
    python -m bench.defaults_servers proxy --port 0 --upstream http://127.0.0.1:9000 --loop uvloop
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

from aiohttp import web

from bench import plain_proxy
from bench.processes import ServerProcess

__all__ = ["BARE_BODY", "bare_app", "main", "server"]

BARE_BODY = b'{"id":"T-1","status":"created"}'
"""What the bare handler answers to every POST (with 201)."""


def bare_app() -> web.Application:
    """An application that answers every POST with 201 and `BARE_BODY`.

    >>> app = bare_app()
    """
    app = web.Application()
    app.router.add_post("/{tail:.*}", _created)
    return app


async def _created(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(status=201, body=BARE_BODY, content_type="application/json")


def server(log_dir: Path, kind: str, *, loop: str, upstream: str = "") -> ServerProcess:
    """A `bench.processes.ServerProcess` running this module (its log in `log_dir`)."""
    argv = [sys.executable, "-m", "bench.defaults_servers", kind, "--port", "0", "--loop", loop]
    if upstream:
        argv += ["--upstream", upstream]
    name = f"{'bare handler' if kind == 'bare' else 'plain proxy'} ({loop})"
    return ServerProcess(name, argv, log_path=log_dir / f"defaults_{kind}_{loop}.log")


def main(argv: Sequence[str] | None = None) -> int:
    """Serve a baseline until SIGINT or SIGTERM."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.defaults_servers", description="bench.defaults' baselines."
    )
    parser.add_argument("kind", choices=("bare", "proxy"), help="what to serve")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port; 0 lets the OS choose")
    parser.add_argument("--upstream", default="", help="the proxy's upstream base URL")
    parser.add_argument(
        "--loop", choices=("asyncio", "uvloop"), default="asyncio", help="event loop"
    )
    args = parser.parse_args(argv)
    if args.kind == "proxy" and not args.upstream:
        parser.error("proxy needs --upstream")
    if args.loop == "uvloop":
        import uvloop  # type: ignore[import-not-found, unused-ignore]

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    if args.kind == "bare":
        app, name = bare_app(), f"bare handler ({args.loop})"
    else:
        app, name = plain_proxy.create_app(args.upstream), f"plain proxy ({args.loop})"
    asyncio.run(plain_proxy.serve_until_signalled(name, app, args.host, args.port))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
