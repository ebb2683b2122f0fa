"""`/admin/`: the operator console, eight static files served by the admin listener.

The page is public (it holds nothing secret); everything it shows comes from the
admin API with the token the operator types. The headers make the browser hold
the page to what it is: scripts and styles from this origin only, no inline code,
no HTML built from strings (Trusted Types), not framed, nothing sent to another site.
The files are read once, at the first request, from the installed package.
"""

from __future__ import annotations

import functools
from importlib import resources

from aiohttp import web

from gateway.engine.errors import NotFound
from gateway.web.appkeys import SETTINGS

CONTENT_SECURITY_POLICY = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "connect-src 'self'",
        "img-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
        "require-trusted-types-for 'script'",
        "trusted-types 'none'",
    )
)

SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Cache-Control": "no-cache",
}

_FILES = {
    "": ("index.html", "text/html"),
    "console.js": ("console.js", "text/javascript"),
    "api.js": ("api.js", "text/javascript"),
    "dom.js": ("dom.js", "text/javascript"),
    "list.js": ("list.js", "text/javascript"),
    "operation.js": ("operation.js", "text/javascript"),
    "console.css": ("console.css", "text/css"),
    "console.svg": ("console.svg", "image/svg+xml"),
}


@functools.cache
def _read(name: str) -> bytes:
    return resources.files("gateway.web").joinpath("console", name).read_bytes()


def _require_enabled(request: web.Request) -> None:
    # As the admin API: without a token there is no console to sign in to.
    if not request.app[SETTINGS].admin.enabled:
        raise NotFound("the operator console is disabled (no admin token is configured)")


async def console_file(request: web.Request) -> web.Response:
    _require_enabled(request)
    entry = _FILES.get(request.match_info.get("file", ""))
    if entry is None:
        raise NotFound(f"nothing at {request.path}")
    name, content_type = entry
    return web.Response(
        body=_read(name), content_type=content_type, charset="utf-8", headers=SECURITY_HEADERS
    )


async def console_redirect(request: web.Request) -> web.Response:
    _require_enabled(request)
    raise web.HTTPPermanentRedirect("/admin/", headers=SECURITY_HEADERS)


def add_console_routes(app: web.Application) -> None:
    """`/admin` redirects to `/admin/`; the page and its assets (`_FILES`) are below it."""
    app.router.add_get("/admin", console_redirect)
    app.router.add_get("/admin/", console_file)
    app.router.add_get("/admin/{file:[a-z]+\\.(?:js|css|svg)}", console_file)
