"""Methods the gateway never forwards, on any path: refused before routing.

- `TRACE` makes a server echo the request it received. Forwarded, the echo
  would carry the route's `upstream_headers` (the tool API's credentials)
  back to an agent, which must never hold them.
- `CONNECT` asks for a tunnel; the gateway is not an open proxy.
- A method override (`X-HTTP-Method-Override: POST` on a `GET`) names a
  method the gateway does not see: an upstream that honours it would perform
  a POST the gateway passed through unprotected. Refused (400), never guessed.

>>> sorted(NEVER_FORWARDED)
['CONNECT', 'TRACE']
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from gateway.engine.errors import InvalidRequest, MethodNotAllowed

if TYPE_CHECKING:
    from aiohttp.typedefs import Handler

__all__ = ["METHOD_OVERRIDES", "NEVER_FORWARDED", "method_guard_middleware"]

NEVER_FORWARDED = frozenset({"TRACE", "CONNECT"})

METHOD_OVERRIDES = ("X-HTTP-Method-Override", "X-Method-Override", "X-HTTP-Method")
"""Headers some frameworks read as the request's real method."""


@web.middleware
async def method_guard_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.method in NEVER_FORWARDED:
        raise MethodNotAllowed(f"{request.method} is never forwarded by the gateway")
    for name in METHOD_OVERRIDES:
        if name in request.headers:
            raise InvalidRequest(
                f"{name} is refused: the gateway protects the method it sees, and an upstream "
                "that honours the header would perform another one; send that method itself"
            )
    return await handler(request)
