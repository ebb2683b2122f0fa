"""An example "ticket" tool API with no idempotency of its own.

This is the kind of API the gateway exists for: every ``POST`` applies a new
effect, a retry creates a second ticket, and nothing in the API itself can tell
a retry from a new request. It keeps its state in memory, so a restart forgets
everything; that is enough for demos and for end-to-end tests.

One concession makes it reconcilable through a gateway probe: a ticket records
the ``Idempotency-Key`` header it arrived with (the gateway's forwarded key:
by default the operation id, different for every caller's scope) as
``idempotency_key``. A route whose probe is
``GET /v1/issues?idempotency_key={forwarded_key}`` can then ask whether an
effect exists. It does not dedupe on it: a retry is still a second ticket.

One switch makes it slow, to see what the gateway does when a tool does not
answer in time: ``?delay=SECONDS`` on a ``POST`` waits that long, then applies
the effect and answers (a tool that applies a request late, after its caller
gave up). Behind the gateway, a delay past the route's ``timeout`` ends in
``504 upstream-timeout`` and an ``unknown`` operation that the route's probe
later finds applied.

Run it with::

    python -m examples.tool_api --host 127.0.0.1 --port 9000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web

if TYPE_CHECKING:
    from collections.abc import Sequence

    from aiohttp.typedefs import Handler

__all__ = ["create_app", "main"]


@dataclass(frozen=True)
class Issue:
    id: str
    title: str
    idempotency_key: str | None


@dataclass(frozen=True)
class Email:
    id: str
    to: str
    subject: str


@dataclass
class ToolState:
    """Everything the API remembers; one per application."""

    issues: list[Issue] = field(default_factory=list)
    emails: list[Email] = field(default_factory=list)


STATE = web.AppKey("state", ToolState)


class BadRequest(Exception):
    """A request body the API refuses; rendered as a 400 JSON error."""


def create_app() -> web.Application:
    """Build the tool API with empty state.

    >>> runner = web.AppRunner(create_app())
    """
    app = web.Application(middlewares=[_json_errors, _slow])
    app[STATE] = ToolState()
    app.router.add_post("/v1/issues", _create_issue)
    app.router.add_get("/v1/issues", _list_issues)
    app.router.add_post("/v1/emails", _send_email)
    app.router.add_get("/v1/emails", _list_emails)
    app.router.add_get("/v1/stats", _stats)
    return app


@web.middleware
async def _json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except BadRequest as exc:
        return web.json_response({"error": str(exc)}, status=400)


MAX_DELAY_SECONDS = 3600.0


@web.middleware
async def _slow(request: web.Request, handler: Handler) -> web.StreamResponse:
    """`?delay=SECONDS` on a POST: wait, then apply the effect and answer."""
    if request.method == "POST" and "delay" in request.query:
        try:
            seconds = float(request.query["delay"])
        except ValueError:
            seconds = -1.0
        if not 0 <= seconds <= MAX_DELAY_SECONDS:  # also refuses nan and inf
            raise BadRequest(f"delay must be a number of seconds from 0 to {MAX_DELAY_SECONDS:g}")
        await request.read()  # kept by the request: the effect applies if the caller has left
        await asyncio.sleep(seconds)
    return await handler(request)


async def _create_issue(request: web.Request) -> web.Response:
    body = await _json_object(request)
    title = _string(body, "title")
    state = request.app[STATE]
    issue = Issue(
        id=f"T-{len(state.issues) + 1}",
        title=title,
        idempotency_key=request.headers.get("Idempotency-Key"),
    )
    state.issues.append(issue)
    return web.json_response(asdict(issue), status=201)


async def _list_issues(request: web.Request) -> web.Response:
    issues = request.app[STATE].issues
    if "idempotency_key" not in request.query:
        return web.json_response({"items": [asdict(issue) for issue in issues]})
    wanted = request.query["idempotency_key"]
    for issue in issues:
        if issue.idempotency_key == wanted:
            return web.json_response(asdict(issue))
    return web.json_response({"error": "not found"}, status=404)


async def _send_email(request: web.Request) -> web.Response:
    body = await _json_object(request)
    to, subject = _string(body, "to"), _string(body, "subject")
    state = request.app[STATE]
    email = Email(id=f"E-{len(state.emails) + 1}", to=to, subject=subject)
    state.emails.append(email)
    # 202: like most mail APIs, accepted for delivery rather than delivered.
    return web.json_response(asdict(email), status=202)


async def _list_emails(request: web.Request) -> web.Response:
    return web.json_response({"items": [asdict(email) for email in request.app[STATE].emails]})


async def _stats(request: web.Request) -> web.Response:
    state = request.app[STATE]
    return web.json_response({"issues": len(state.issues), "emails": len(state.emails)})


async def _json_object(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(f"body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequest("body must be a JSON object")
    return body


def _string(body: dict[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str):
        raise BadRequest(f"{name} must be a string")
    return value


async def _serve(host: str, port: int) -> None:
    runner = web.AppRunner(create_app(), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        bound_host, bound_port = runner.addresses[0][:2]
        # Scripts and tests wait for this exact line before sending requests.
        print(f"tool API listening on http://{bound_host}:{bound_port}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> int:
    """Serve the tool API until SIGINT or SIGTERM.

    >>> main(["--port", "0"])  # prints "tool API listening on http://127.0.0.1:<port>"
    """
    parser = argparse.ArgumentParser(
        prog="python -m examples.tool_api", description="An example ticket tool API."
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=9000, help="port; 0 lets the OS choose")
    args = parser.parse_args(argv)
    asyncio.run(_serve(args.host, args.port))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
