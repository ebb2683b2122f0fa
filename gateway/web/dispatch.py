"""Where a proxied request goes: the HTTP proxy or the MCP front end, by its route's kind.

Both front ends translate to the same engine; this is the one place that
knows there are two of them.
"""

from __future__ import annotations

from aiohttp import web

from gateway.mcp.view import serve_mcp
from gateway.proxy.view import match_route, serve_http


async def proxy(request: web.Request) -> web.StreamResponse:
    match = match_route(request)
    if match.route.kind == "mcp":
        return await serve_mcp(request, match)
    return await serve_http(request, match)
