"""The gateway configuration each benchmark row runs with, written as a TOML file.

Built through the gateway's own `Settings` model and written back with
`render_effective`, so a setting the gateway would refuse fails here, before
any server starts, naming the key. One route: "tickets" at `/tickets` in
front of the tool API, or for the MCP rows "tools" at `/tools` (`kind = "mcp"`)
in front of the MCP server; everything else is the production default (24 h
retention, 60 s sweep, no quotas, one serving process) because that is what
operators run, the similar-operation guard included (`similar_guard =
"unsettled"`, `similar_window = "15m"`). `workers` sets `[server] workers` for
the worker-process rows (`bench.worker_rows`); `similar_guard` sets the route's
guard, for the rows that measure what the guard costs (`bench.scenarios`).

Two settings are deliberate bench choices, not the production defaults:
`shared_scope = true` (the load generators send no credential) and the log
level, `warning` unless a row asks for `info` (the production default): a row
measures the request path, not the access log's sink, and the access log's
cost is measured on its own (the HTTP rows' `log info` row; for MCP routes,
bench/PROFILE.md).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

from gateway.config import Settings, render_effective

__all__ = [
    "MCP_PREFIX",
    "ROUTE_PREFIX",
    "LogLevel",
    "SimilarGuard",
    "sqlite_url",
    "write_gateway_config",
    "write_mcp_gateway_config",
    "write_mcp_stdio_gateway_config",
]

ROUTE_PREFIX = "/tickets"
"""Where the gateway exposes the tool API: POST {gateway}/tickets/v1/issues."""

MCP_PREFIX = "/tools"
"""Where the gateway exposes the MCP server's endpoint: POST {gateway}/tools."""

LogLevel = Literal["debug", "info", "warning", "error"]
SimilarGuard = Literal["unsettled", "all", "off"]
"""A route's `similar_guard`: which twins refuse a new key for the same request."""


def write_gateway_config(
    path: Path,
    *,
    upstream: str,
    store_url: str,
    log_level: LogLevel = "warning",
    workers: int = 1,
    similar_guard: SimilarGuard | None = None,
    admin_token: str | None = None,
    sweep_interval: str | None = None,
) -> Path:
    """Write a config for a gateway on 127.0.0.1, OS-chosen port, and return `path`.

    `log_level="info"` turns on the JSON access log (one line a request), whose
    cost the benchmark reports separately. `workers` above 1 runs a supervisor
    and that many worker processes on the one port (`[server] workers`).
    `similar_guard` sets the route's guard ("off": no twin lookup at all); None
    leaves the default ("unsettled"). `admin_token` turns the admin API on, on a
    port of its own; `sweep_interval` (a duration, "1s") replaces the default 60 s.

    >>> # write_gateway_config(tmp / "gw.toml", upstream=api.url, store_url="sqlite:////tmp/g.db")
    """
    route: dict[str, object] = {
        "name": "tickets",
        "prefix": ROUTE_PREFIX,
        "upstream": upstream,
        "timeout": "10s",
    }
    if similar_guard is not None:
        route["similar_guard"] = similar_guard
    extra: dict[str, dict[str, object]] = {}
    if admin_token is not None:  # by its digest: the written file shows no secret
        digest = hashlib.sha256(admin_token.encode()).hexdigest()
        token = {"name": "bench", "token_sha256": digest, "role": "viewer"}
        extra["admin"] = {"tokens": [token], "port": 0}
    if sweep_interval is not None:
        extra["idempotency"] = {"sweep_interval": sweep_interval}
    return _write(path, route, store_url, log_level, workers=workers, extra=extra)


def write_mcp_gateway_config(
    path: Path, *, upstream: str, store_url: str, log_level: LogLevel = "warning"
) -> Path:
    """Like `write_gateway_config`, with one MCP route "tools" at `/tools` instead.

    `upstream` is the MCP endpoint itself (`http://host:port/mcp`): a
    Streamable HTTP server has one URL. Everything else on the route is the
    MCP default: every tool protected, a call without a key passed through.
    """
    route = {
        "name": "tools",
        "prefix": MCP_PREFIX,
        "upstream": upstream,
        "kind": "mcp",
        "timeout": "10s",
    }
    return _write(path, route, store_url, log_level)


def write_mcp_stdio_gateway_config(
    path: Path, *, command: Sequence[str], store_url: str, log_level: LogLevel = "warning"
) -> Path:
    """Like `write_mcp_gateway_config`, the route's server a stdio child the gateway
    starts (`command`), with the stdio defaults (a child per scope; one scope here)."""
    route = {
        "name": "tools",
        "prefix": MCP_PREFIX,
        "command": list(command),
        "kind": "mcp",
        "timeout": "10s",
    }
    return _write(path, route, store_url, log_level)


def _write(
    path: Path,
    route: Mapping[str, object],
    store_url: str,
    log_level: LogLevel,
    *,
    workers: int = 1,
    extra: Mapping[str, Mapping[str, object]] | None = None,
) -> Path:
    document: dict[str, dict[str, object]] = {
        "server": {"host": "127.0.0.1", "port": 0, "workers": workers},
        "store": {"url": store_url},
        "logging": {"level": log_level, "format": "json"},
        "idempotency": {"shared_scope": True},  # the load generators send no credential
    }
    for section, values in (extra or {}).items():
        document.setdefault(section, {}).update(values)
    settings = Settings.model_validate({**document, "routes": [route]})
    path.write_text(render_effective(settings))
    return path


def sqlite_url(path: Path) -> str:
    """The store URL of an SQLite file (absolute: the gateway runs from the repository root)."""
    return f"sqlite:///{path.resolve()}"
