"""Span attribute names, and the rules for what a span may record.

OpenTelemetry's semantic-convention names where one exists (HTTP and URL
attributes, stable since semconv 1.23), `idempotency.*` for the gateway's own.
Spans follow the request log's policy (docs/operations.md, "Logs"): the route,
the key, the operation and its state, a short hash of the scope; never a
body, never a header value, never a query string (query strings carry API
keys), never the userinfo of a URL, never a credential.
"""

from __future__ import annotations

from typing import Final
from urllib.parse import urlsplit, urlunsplit

# OpenTelemetry semantic conventions (https://opentelemetry.io/docs/specs/semconv/).
HTTP_REQUEST_METHOD: Final = "http.request.method"
HTTP_REQUEST_METHOD_ORIGINAL: Final = "http.request.method_original"
HTTP_RESPONSE_STATUS_CODE: Final = "http.response.status_code"
HTTP_ROUTE: Final = "http.route"
URL_FULL: Final = "url.full"
URL_PATH: Final = "url.path"
URL_SCHEME: Final = "url.scheme"
URL_TEMPLATE: Final = "url.template"
SERVER_ADDRESS: Final = "server.address"
SERVER_PORT: Final = "server.port"
NETWORK_PROTOCOL_VERSION: Final = "network.protocol.version"
ERROR_TYPE: Final = "error.type"
MCP_METHOD_NAME: Final = "mcp.method.name"
GEN_AI_TOOL_NAME: Final = "gen_ai.tool.name"

# The gateway's own.
OPERATION_ID: Final = "idempotency.operation_id"
ROUTE: Final = "idempotency.route"
STATE: Final = "idempotency.state"
ATTEMPT: Final = "idempotency.attempt"
OUTCOME: Final = "idempotency.outcome"
KEY: Final = "idempotency.key"
"""As in the request log: the caller's key names an effect, it is not a credential."""
SCOPE: Final = "idempotency.scope"
"""A short hash of the scope (`gateway.engine.scopes.scope_hash`), as in the request log."""
REQUEST_ID: Final = "idempotency.request_id"
WRITE: Final = "idempotency.write"
"""Which outcome write a record span is: `complete`, `release` or `mark_unknown`."""
UNKNOWN_REASON: Final = "idempotency.unknown.reason"
PROBE_RESULT: Final = "idempotency.probe.result"
RESOLVED_BY: Final = "idempotency.resolution.by"
RESOLUTION_OUTCOME: Final = "idempotency.resolution.outcome"

SERVICE_NAME: Final = "idempotency-gateway"
"""`service.name` when neither OTEL_SERVICE_NAME nor OTEL_RESOURCE_ATTRIBUTES names one."""

KNOWN_METHODS: Final = frozenset(
    {"CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "QUERY", "TRACE"}
)
"""The methods the conventions name; any other is recorded as `_OTHER`."""
_DEFAULT_PORTS = {"http": 80, "https": 443}

AttributeValue = str | int | bool
Attributes = dict[str, AttributeValue]


def method_attributes(method: str) -> Attributes:
    """`http.request.method` as the conventions want it: a method they do not know is
    `_OTHER`, with the method as sent beside it (a bounded attribute stays bounded).

    >>> method_attributes("PROPFIND")
    {'http.request.method': '_OTHER', 'http.request.method_original': 'PROPFIND'}
    """
    if method in KNOWN_METHODS:
        return {HTTP_REQUEST_METHOD: method}
    return {HTTP_REQUEST_METHOD: "_OTHER", HTTP_REQUEST_METHOD_ORIGINAL: method}


def upstream_url_attributes(url: str) -> Attributes:
    """Where an upstream call goes: `url.full` without its query, fragment or userinfo,
    and the server's address and port.

    >>> upstream_url_attributes("https://u:p@api.example:8443/v1/issues?api_key=s3cret")
    {'url.full': 'https://api.example:8443/v1/issues', 'server.address': 'api.example', \
'server.port': 8443}
    """
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if parts.port is not None:
        netloc += f":{parts.port}"
    return {
        URL_FULL: urlunsplit((parts.scheme, netloc, parts.path, "", "")),
        **server_attributes(url),
    }


def server_attributes(url: str) -> Attributes:
    """`server.address` and `server.port` of a URL (the scheme's port when it names none).

    >>> server_attributes("http://127.0.0.1/mcp")
    {'server.address': '127.0.0.1', 'server.port': 80}
    """
    parts = urlsplit(url)
    return {
        SERVER_ADDRESS: parts.hostname or "",
        SERVER_PORT: parts.port or _DEFAULT_PORTS.get(parts.scheme, 0),
    }
