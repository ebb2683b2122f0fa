"""Methods the gateway never forwards, on any path: refused before routing.

- `TRACE` makes a server echo the request it received. Forwarded, the echo
  would carry the route's `upstream_headers` (the tool API's credentials)
  back to an agent, which must never hold them.
- `CONNECT` asks for a tunnel; the gateway is not an open proxy.

>>> sorted(NEVER_FORWARDED)
['CONNECT', 'TRACE']
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from gateway.errors import MethodNotAllowed

if TYPE_CHECKING:
    from aiohttp.typedefs import Handler

__all__ = ["NEVER_FORWARDED", "method_guard_middleware"]

NEVER_FORWARDED = frozenset({"TRACE", "CONNECT"})


@web.middleware
async def method_guard_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.method in NEVER_FORWARDED:
        raise MethodNotAllowed(f"{request.method} is never forwarded by the gateway")
    return await handler(request)
