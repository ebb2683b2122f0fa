"""The baseline: the least an aiohttp reverse proxy can do, with no idempotency at all.

The gateway is an aiohttp server plus an aiohttp client plus its own work, so
the fair yardstick for "its own work" is this proxy, measured in the same run:
one shared `ClientSession`, read the whole body, forward it, return status,
headers and body. No streaming, no retries, no routing, no logging.

`--processes N` (N > 1) is the yardstick for a gateway with `[server]
workers = N`: this process becomes a supervisor that binds the port (so port
0 resolves to a real port), starts N children that each listen on that same
host:port with SO_REUSEPORT and share nothing else (the kernel spreads the
connections), and serves nothing itself, as the gateway's supervisor does.
The process tree is N + 1 processes, the parent idle. Its socket is only
bound, never listening, so the kernel gives it no connections, yet it holds
the port. The children get SIGTERM when it dies (PR_SET_PDEATHSIG, even on
SIGKILL); on SIGTERM or SIGINT it stops them and waits for them; if one dies
it stops the others and exits 1. It prints its one "listening on" line only
once every child has printed its own.

Run it with::

    python -m bench.plain_proxy --port 0 --upstream http://127.0.0.1:9000
    python -m bench.plain_proxy --port 0 --upstream http://127.0.0.1:9000 --processes 2
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence

import aiohttp
from aiohttp import web

__all__ = ["create_app", "main", "serve_until_signalled"]

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

_PR_SET_PDEATHSIG = 1
"""prctl(2): the signal this process gets when its parent dies (linux/prctl.h)."""
_START_TIMEOUT = 90.0
"""Seconds every child has to print its "listening on" line (less than `bench.processes`' 120:
only a hung start takes this long, but a busy machine can take tens of seconds to start Python)."""
_STOP_GRACE = 15.0
"""Seconds the children get to drain after SIGTERM (less than `bench.processes`' 20)."""
_SUPERVISOR_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGCHLD})

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


async def serve_until_signalled(
    name: str, app: web.Application, host: str, port: int, *, reuse_port: bool = False
) -> None:
    """Serve `app` until SIGINT or SIGTERM, after printing the "<name> listening on URL"
    line `bench.processes` waits for (the port the OS chose)."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port, reuse_port=reuse_port).start()
        bound_host, bound_port = runner.addresses[0][:2]
        print(f"{name} listening on http://{bound_host}:{bound_port}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()


def _supervise(host: str, port: int, upstream: str, count: int) -> int:
    """Bind the port, serve it with `count` children, wait for a signal; the exit status."""
    # Blocked from the start, so a signal that comes while the children start
    # is kept pending for sigwaitinfo below instead of killing this process
    # (and with it, through PR_SET_PDEATHSIG, the children) half-way.
    signal.pthread_sigmask(signal.SIG_BLOCK, _SUPERVISOR_SIGNALS)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    children: list[subprocess.Popen[str]] = []
    with socket.socket(family, socket.SOCK_STREAM) as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        holder.bind((host, port))
        bound_host, bound_port = holder.getsockname()[:2]
        argv = [
            sys.executable, "-m", "bench.plain_proxy",
            "--host", bound_host,
            "--port", str(bound_port),
            "--upstream", upstream,
            "--reuse-port",
        ]  # fmt: skip
        try:
            for _ in range(count):
                children.append(
                    subprocess.Popen(
                        argv,
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.PIPE,
                        text=True,
                        # Safe here: this process runs no threads.
                        preexec_fn=_child_setup(os.getpid()),
                    )
                )
            _await_listening(children)
            shown = f"[{bound_host}]" if family == socket.AF_INET6 else bound_host
            print(
                f"plain proxy ({count} processes) listening on http://{shown}:{bound_port}",
                flush=True,
            )
            while True:
                signum = signal.sigwaitinfo(_SUPERVISOR_SIGNALS).si_signo
                if signum != signal.SIGCHLD:
                    return 0
                dead = [child for child in children if child.poll() is not None]
                if dead:
                    codes = ", ".join(f"pid {c.pid}: {c.returncode}" for c in dead)
                    print(f"plain proxy: a child exited ({codes}); stopping", file=sys.stderr)
                    return 1
        finally:
            _stop(children)


def _child_setup(parent: int) -> Callable[[], None]:
    """What each child runs between fork and exec: unblock signals, die with `parent`."""
    libc = ctypes.CDLL(None, use_errno=True)  # loaded before the fork, not in the child

    def setup() -> None:
        # The signal mask survives exec: the child's asyncio handlers need these delivered.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _SUPERVISOR_SIGNALS)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent:  # the parent died before prctl: no signal will come
            os.kill(os.getpid(), signal.SIGKILL)

    return setup


def _await_listening(children: Sequence[subprocess.Popen[str]]) -> None:
    """Return once every child has printed its "listening on" line; raise if one did not."""
    deadline = time.monotonic() + _START_TIMEOUT
    for child in children:
        assert child.stdout is not None
        ready, _, _ = select.select([child.stdout], [], [], max(0.0, deadline - time.monotonic()))
        line = child.stdout.readline() if ready else ""
        if "listening on http://" not in line:
            raise RuntimeError(f"plain proxy child {child.pid} did not start: {line!r}")


def _stop(children: Sequence[subprocess.Popen[str]]) -> None:
    """SIGTERM every child still running, wait for them to drain, SIGKILL the late."""
    for child in children:
        if child.poll() is None:
            child.terminate()
    deadline = time.monotonic() + _STOP_GRACE
    for child in children:
        try:
            child.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        if child.stdout is not None:
            child.stdout.close()


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
    parser.add_argument(
        "--processes",
        type=int,
        default=1,
        help="serving processes on the one port (default 1: this one); above 1, this "
        "process supervises that many children listening with SO_REUSEPORT",
    )
    # A child of --processes N: listen with SO_REUSEPORT beside its siblings.
    parser.add_argument("--reuse-port", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.processes < 1:
        parser.error("--processes: expected 1 or more")
    if args.processes > 1:
        return _supervise(args.host, args.port, args.upstream, args.processes)
    _use_uvloop()
    app = create_app(args.upstream)
    asyncio.run(
        serve_until_signalled("plain proxy", app, args.host, args.port, reuse_port=args.reuse_port)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
