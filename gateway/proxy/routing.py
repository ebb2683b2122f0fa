"""Map a request path to a configured route and the upstream path it becomes.

Only configured upstreams are ever contacted: the upstream URL is built from
the route's base and the remainder of the path, never from anything else the
caller sends (not `Host`, not an absolute-form target: aiohttp hands over
only its path, which is routed like any other). Paths with dot segments
(plain, percent-encoded or with `;` parameters), empty segments, backslashes,
encoded slashes, invalid escapes or encoded NULs are refused before matching,
so a remainder can never climb out of the route's base path on an upstream,
whatever that upstream's own path rules are. Dot segments are judged on each
segment decoded, its `;` parameters cut off (`%2e%2e%3B` is `..;`, which
Tomcat, Jetty and Spring read as `..`), and the forwarder sends exactly the
bytes judged here: nothing re-encodes them afterwards.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from gateway.engine.errors import InvalidRequest, NoRoute

if TYPE_CHECKING:
    from gateway.config import RouteSettings

_DOT_SEGMENT = re.compile(r"(^|/)(\.|%2e){1,2}(/|$)", re.IGNORECASE)
_ENCODED_SLASH = re.compile(r"%2f|%5c", re.IGNORECASE)
_BAD_ESCAPE = re.compile(r"%(?![0-9a-f]{2})|%00", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class RouteMatch:
    """A request's route and where it goes upstream."""

    route: RouteSettings
    upstream_url: str


class RouteTable:
    """Longest-prefix routing over the configured routes.

    >>> # RouteTable(settings.routes).match("/tickets/v1/issues", "a=1").upstream_url
    >>> # 'http://127.0.0.1:9000/v1/issues?a=1'
    """

    def __init__(self, routes: Sequence[RouteSettings]) -> None:
        self._routes = sorted(routes, key=lambda r: len(r.prefix), reverse=True)
        self.by_name = {route.name: route for route in routes}

    def match(self, raw_path: str, query_string: str) -> RouteMatch:
        check_path(raw_path)
        for route in self._routes:
            prefix = route.prefix
            if raw_path == prefix or raw_path.startswith(prefix + "/"):
                url = route.upstream + _remainder(route, raw_path[len(prefix) :])
                if query_string:
                    url += "?" + query_string
                return RouteMatch(route=route, upstream_url=url)
        raise NoRoute(f"no route matches the path {raw_path!r}")


def _remainder(route: RouteSettings, remainder: str) -> str:
    """The path after the prefix. The prefix itself reaches the upstream's root, except
    on an MCP route, whose upstream URL is the server's one endpoint (`/mcp`), as is:
    servers redirect `/mcp/` there, and MCP clients do not follow redirects."""
    if remainder:
        return remainder
    if route.kind == "mcp" and urlsplit(route.upstream).path:
        return ""
    return "/"


def check_path(raw_path: str) -> None:
    """Refuse targets that are not plain origin-form paths.

    The checks that need a dot or an escape are skipped for the paths (most) that
    have neither; the order of the refusals is the same either way.
    """
    if not raw_path.startswith("/"):
        raise InvalidRequest("the request target must be an origin-form path starting with '/'")
    escaped = "%" in raw_path
    if escaped or "." in raw_path:
        if _DOT_SEGMENT.search(raw_path):
            raise InvalidRequest("the path may not contain '.' or '..' segments")
        if any(_is_dot_segment(segment) for segment in raw_path.split("/")):
            raise InvalidRequest(
                "the path may not contain '.;' or '..;' segments (in any spelling)"
            )
    if "//" in raw_path:
        raise InvalidRequest("the path may not contain empty segments ('//')")
    if "\\" in raw_path or (escaped and _ENCODED_SLASH.search(raw_path)):
        raise InvalidRequest("the path may not contain backslashes or encoded slashes")
    if escaped and _BAD_ESCAPE.search(raw_path):
        raise InvalidRequest("the path has an invalid percent-escape (or an encoded NUL)")


def _is_dot_segment(raw_segment: str) -> bool:
    """`.` or `..` once decoded and stripped of `;` parameters, however it is spelled."""
    return unquote(raw_segment).split(";", 1)[0] in (".", "..")
