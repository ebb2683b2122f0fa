"""Which listener a request came in on, and which paths each listener serves.

With the admin API enabled (`[admin] token`), its endpoints are served only
on the admin listener (`[admin] host` and `port`: loopback by default, or an
operators' network) and the main listener answers 404 for them; the admin
listener serves nothing but the admin API and the health endpoints. `/metrics`
is served where `[metrics] listener` says (the main listener by default). The sites are
started by `gateway.web.serve.start_sites`.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from gateway.engine.errors import NotFound
from gateway.web.appkeys import SETTINGS
from gateway.web.problems import Handler

_SHARED = frozenset({"/healthz", "/readyz"})
METRICS_PATH = "/metrics"


@dataclass(slots=True)
class Listeners:
    """Filled in once the sites listen (port 0 is only known then)."""

    admin_address: tuple[str, int] | None = None
    """The admin site's (host, port) as it listens: told apart by both, never the port
    alone (the same port on another address is another listener)."""


LISTENERS = web.AppKey("listeners", Listeners)


def _is_admin_path(path: str) -> bool:
    return path == "/admin" or path.startswith("/admin/")


_WILDCARDS = frozenset({"0.0.0.0", "::", ""})


def _is_admin_listener(sockname: tuple[object, ...], admin: tuple[str, int]) -> bool:
    """The local address a request arrived on is the admin site's: the same port, and the
    same address unless the admin site listens on every address (the config refuses an
    admin port equal to the main one, so the port then tells them apart)."""
    host, port = admin
    return sockname[1] == port and (host in _WILDCARDS or sockname[0] == host)


@web.middleware
async def listener_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    admin_address = request.app[LISTENERS].admin_address
    if request.path not in _SHARED:
        # No admin site listening (yet): no request can be on it.
        sockname = request.transport.get_extra_info("sockname") if request.transport else None
        on_admin_listener = (
            admin_address is not None
            and sockname is not None
            and _is_admin_listener(sockname, admin_address)
        )
        if request.path == METRICS_PATH:
            served = request.app[SETTINGS].metrics.listener
            if served != "both" and (served == "admin") != on_admin_listener:
                raise NotFound(f"nothing at {request.path} on this listener")
        elif _is_admin_path(request.path) != on_admin_listener:
            raise NotFound(f"nothing at {request.path} on this listener")
    return await handler(request)


ADMIN_ANSWER_HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}
"""On every answer of the admin API, problems included: operations, notes and requests
are no cache's to keep, and a JSON answer is never sniffed into something that runs."""


@web.middleware
async def admin_headers_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Put `ADMIN_ANSWER_HEADERS` on the admin API's answers (outside the problem
    middleware, so its problem answers get them too)."""
    response = await handler(request)
    if request.path == "/admin" or request.path.startswith("/admin/"):
        for name, value in ADMIN_ANSWER_HEADERS.items():
            response.headers.setdefault(name, value)
    return response
