"""OpenAPI 3.1 for the gateway's own endpoints, served at `/openapi.json` and kept in docs/.

Only the gateway's own paths are described: proxied routes depend on the
config. Whatever can be taken from the code is: problem types, titles and
statuses come from `gateway.errors`, the resolve body from its pydantic model,
limits from the handlers' constants, so the document cannot drift from them.
`tests/test_openapi.py` runs schemathesis against a real gateway with it.

Regenerate the copy in docs/ with `python -m gateway.openapi > docs/openapi.json`.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from aiohttp import web

from gateway import __version__
from gateway.admin_view import DEFAULT_LIMIT, MAX_LIMIT
from gateway.errors import (
    PROBLEM_BASE_URI,
    GatewayError,
    InProgress,
    InvalidKey,
    InvalidRequest,
    KeyMismatch,
    LeaseLost,
    MissingKey,
    NoRoute,
    NotFound,
    NotResolvable,
    OutcomeUnknown,
    PayloadTooLarge,
    PreconditionFailed,
    ReceiptExpired,
    ReceiptNotRetained,
    RouteSaturated,
    StoreUnavailable,
    Unauthorized,
    UnknownKey,
    UpstreamConnectionLost,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from gateway.headers import IDEMPOTENCY_KEY, IDEMPOTENCY_STATUS, IDEMPOTENT_REPLAYED
from gateway.keys import MAX_KEY_LENGTH
from gateway.models import State
from gateway.operations_view import MAX_RESOLVE_BODY
from gateway.problems import PROBLEM_JSON
from gateway.request_log import REQUEST_ID
from gateway.resolve_body import ResolveBody

__all__ = ["openapi_document", "openapi_json", "render"]

JSON = "application/json"
_SCHEMAS = "#/components/schemas/"
_PRINTABLE_ASCII = "^[ -~]+$"

_PROXY_PROBLEMS: tuple[type[GatewayError], ...] = (
    MissingKey,
    InvalidKey,
    InvalidRequest,
    Unauthorized,
    PayloadTooLarge,
    KeyMismatch,
    InProgress,
    OutcomeUnknown,
    ReceiptExpired,
    ReceiptNotRetained,
    StoreUnavailable,
    RouteSaturated,
    LeaseLost,
    UpstreamUnreachable,
    UpstreamTimeout,
    UpstreamConnectionLost,
    NoRoute,
)
"""What a proxied request can be refused with (DESIGN.md's table and more), for the description."""

# The problem types each gateway operation can answer with, by operation.
_LOOKUP = (
    InvalidKey,
    InvalidRequest,
    Unauthorized,
    UnknownKey,
    NotFound,
    NoRoute,
    StoreUnavailable,
)
_RESOLVE = (*_LOOKUP, NotResolvable, PreconditionFailed, PayloadTooLarge)
_ADMIN = (InvalidRequest, Unauthorized, NotFound, NoRoute, StoreUnavailable)
_ADMIN_RESOLVE = (*_ADMIN, NotResolvable, PreconditionFailed, PayloadTooLarge)


def _ref(name: str) -> dict[str, str]:
    return {"$ref": _SCHEMAS + name}


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


def _timestamp(description: str) -> dict[str, Any]:
    return {"type": "string", "format": "date-time", "description": description}


def _header(description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"description": description, "schema": schema or {"type": "string"}}


def _problem_line(error: type[GatewayError]) -> str:
    return f"`{error.problem_type}` ({error.status}): {error.title}"


def _problems(errors: tuple[type[GatewayError], ...]) -> dict[str, Any]:
    """One problem+json response per status, its `type` limited to the errors given."""
    by_status: dict[int, list[type[GatewayError]]] = {}
    for error in errors:
        by_status.setdefault(error.status, []).append(error)
    by_status.setdefault(500, []).append(GatewayError)
    responses: dict[str, Any] = {}
    for status, group in sorted(by_status.items()):
        headers: dict[str, Any] = {REQUEST_ID: {"$ref": "#/components/headers/RequestId"}}
        if status != 500:
            headers[IDEMPOTENCY_KEY] = {"$ref": "#/components/headers/IdempotencyKey"}
            headers[IDEMPOTENCY_STATUS] = {"$ref": "#/components/headers/IdempotencyStatus"}
        if status == 503:
            headers["Retry-After"] = {"$ref": "#/components/headers/RetryAfter"}
        responses[str(status)] = {
            "description": "; ".join(_problem_line(error) for error in group),
            "headers": headers,
            "content": {
                PROBLEM_JSON: {
                    "schema": {
                        "allOf": [
                            _ref("Problem"),
                            {
                                "properties": {
                                    "status": {"const": status},
                                    "type": {
                                        "enum": [
                                            PROBLEM_BASE_URI + error.problem_type for error in group
                                        ]
                                    },
                                }
                            },
                        ]
                    }
                }
            },
        }
    return responses


def _ok(description: str, schema: dict[str, Any], headers: dict[str, Any] | None = None) -> Any:
    return {
        "description": description,
        "headers": {REQUEST_ID: {"$ref": "#/components/headers/RequestId"}, **(headers or {})},
        "content": {JSON: {"schema": schema}},
    }


_REQUEST_ID_PARAMETER = {"$ref": "#/components/parameters/RequestId"}
_OPERATION_HEADERS = {
    "ETag": {"$ref": "#/components/headers/ETag"},
    "Cache-Control": _header("Always `no-store`.", {"const": "no-store"}),
}
_KEY_HEADERS = {
    IDEMPOTENCY_KEY: {"$ref": "#/components/headers/IdempotencyKey"},
    IDEMPOTENCY_STATUS: {"$ref": "#/components/headers/IdempotencyStatus"},
}
_IF_MATCH = {
    "name": "If-Match",
    "in": "header",
    "required": False,
    "description": "The `ETag` of a lookup: 412 when the operation changed since.",
    "schema": {"type": "string"},
}
_RESOLVE_BODY = {
    "required": True,
    "description": f"At most {MAX_RESOLVE_BODY} bytes; a `not_applied` outcome has no `response`.",
    "content": {JSON: {"schema": _ref("ResolveRequest")}},
}


def _simple_get(summary: str, ok: dict[str, Any], errors: tuple[type[GatewayError], ...]) -> Any:
    return {
        "get": {
            "summary": summary,
            "security": [],
            "parameters": [_REQUEST_ID_PARAMETER],
            "responses": {"200": ok, **_problems(errors)},
        }
    }


def _paths() -> dict[str, Any]:
    key = {"$ref": "#/components/parameters/Key"}
    op_id = {"$ref": "#/components/parameters/OperationId"}
    scoped: list[dict[str, list[str]]] = [{}, {"clientToken": []}]
    admin: list[dict[str, list[str]]] = [{"adminToken": []}]
    operation = _ref("Operation")
    admin_operation = _ref("AdminOperation")
    return {
        "/healthz": _simple_get(
            "The process is alive",
            _ok("Alive.", {"type": "object", "properties": {"status": {"const": "ok"}}}),
            (),
        ),
        "/readyz": _simple_get(
            "The store is reachable and migrated",
            _ok("Ready.", {"type": "object", "properties": {"status": {"const": "ready"}}}),
            (StoreUnavailable,),
        ),
        "/metrics": _simple_get(
            "Prometheus metrics",
            {
                "description": "The Prometheus text exposition format, version 0.0.4.",
                "headers": {REQUEST_ID: {"$ref": "#/components/headers/RequestId"}},
                "content": {"text/plain": {"schema": {"type": "string"}}},
            },
            (),
        ),
        "/openapi.json": _simple_get(
            "This document", _ok("The OpenAPI 3.1 document.", {"type": "object"}), ()
        ),
        "/operations/{key}": {
            "get": {
                "summary": "What happened to the effect of a key, in the caller's scope",
                "operationId": "lookup",
                "security": scoped,
                "parameters": [key, _REQUEST_ID_PARAMETER],
                "responses": {
                    "200": _ok("The operation.", operation, {**_OPERATION_HEADERS, **_KEY_HEADERS}),
                    **_problems(_LOOKUP),
                },
            }
        },
        "/operations/{key}/resolve": {
            "post": {
                "summary": "Settle the caller's own `unknown` operation",
                "operationId": "resolve",
                "security": scoped,
                "parameters": [key, _IF_MATCH, _REQUEST_ID_PARAMETER],
                "requestBody": _RESOLVE_BODY,
                "responses": {
                    "200": _ok(
                        "The settled operation.", operation, {**_OPERATION_HEADERS, **_KEY_HEADERS}
                    ),
                    **_problems(_RESOLVE),
                },
            }
        },
        "/admin/operations": {
            "get": {
                "summary": "Every scope's operations, oldest first, a page at a time",
                "operationId": "adminListOperations",
                "security": admin,
                "parameters": [
                    {
                        "name": "state",
                        "in": "query",
                        "schema": {"enum": [state.value for state in State]},
                    },
                    {
                        "name": "limit",
                        "in": "query",
                        "schema": {
                            "type": "integer",
                            "minimum": 1,
                            "maximum": MAX_LIMIT,
                            "default": DEFAULT_LIMIT,
                        },
                    },
                    {
                        "name": "cursor",
                        "in": "query",
                        "description": "The `next_cursor` of the previous page (opaque).",
                        "schema": {"type": "string"},
                    },
                    _REQUEST_ID_PARAMETER,
                ],
                "responses": {
                    "200": _ok("One page.", _ref("OperationPage")),
                    **_problems(_ADMIN),
                },
            }
        },
        "/admin/operations/{id}": {
            "get": {
                "summary": "Any scope's operation, by id",
                "operationId": "adminShowOperation",
                "security": admin,
                "parameters": [op_id, _REQUEST_ID_PARAMETER],
                "responses": {
                    "200": _ok("The operation.", admin_operation, _OPERATION_HEADERS),
                    **_problems(_ADMIN),
                },
            }
        },
        "/admin/operations/{id}/resolve": {
            "post": {
                "summary": "Settle any scope's `unknown` operation, by id",
                "operationId": "adminResolveOperation",
                "security": admin,
                "parameters": [op_id, _IF_MATCH, _REQUEST_ID_PARAMETER],
                "requestBody": _RESOLVE_BODY,
                "responses": {
                    "200": _ok("The settled operation.", admin_operation, _OPERATION_HEADERS),
                    **_problems(_ADMIN_RESOLVE),
                },
            }
        },
    }


def _operation_schema() -> dict[str, Any]:
    states = [state.value for state in State]
    return {
        "type": "object",
        "description": "What the gateway knows about one key's effect (DESIGN.md, operation JSON).",
        "required": [
            "id",
            "key",
            "state",
            "route",
            "method",
            "path",
            "fingerprint",
            "attempts",
            "created_at",
            "updated_at",
            "expires_at",
            "forgotten_at",
            "response",
            "resolution",
            "evidence",
            "safe_to_retry",
        ],
        "properties": {
            "id": {"type": "string", "examples": ["op_01JDZ4W6Q8X3M2K7R5T9V0B1C2"]},
            "key": {"type": "string", "description": "The normalized key."},
            "state": {"enum": states},
            "route": {"type": "string", "description": "The route's name."},
            "method": {"type": "string"},
            "path": {"type": "string"},
            "fingerprint": {"type": "string", "examples": ["sha256:9f86d08..."]},
            "attempts": {"type": "integer", "minimum": 0},
            "created_at": _timestamp("When the key was first claimed."),
            "updated_at": _timestamp("The last write."),
            "expires_at": _nullable(_timestamp("When the receipt's body is dropped.")),
            "forgotten_at": _nullable(_timestamp("When the whole record is dropped.")),
            "response": _nullable(_ref("StoredResponse")),
            "response_status": _nullable({"type": "integer"}),
            "body_retained": _nullable({"type": "boolean"}),
            "resolution": _nullable(
                {
                    "type": "object",
                    "required": ["by", "at", "note"],
                    "properties": {
                        "by": {"enum": ["upstream", "probe", "owner", "admin"]},
                        "at": _timestamp("When the outcome was settled."),
                        "note": _nullable({"type": "string"}),
                    },
                }
            ),
            "evidence": {
                "type": "array",
                "description": "Facts learned too late to decide anything (stale writers, probes).",
                "items": {
                    "type": "object",
                    "required": ["at", "source", "detail", "status", "body_sha256"],
                    "properties": {
                        "at": _timestamp("When it was learned."),
                        "source": {"type": "string"},
                        "detail": {"type": "string"},
                        "status": _nullable({"type": "integer"}),
                        "body_sha256": _nullable({"type": "string"}),
                    },
                },
            },
            "lease_expires_at": _nullable(_timestamp("The in-flight lease's expiry.")),
            "fencing_token": {"type": "integer"},
            "safe_to_retry": {
                "type": "boolean",
                "description": "False for `unknown`, and for `completed` without its body.",
            },
            "operation": {"type": "string", "description": "This operation's lookup URL."},
        },
    }


def _components() -> dict[str, Any]:
    resolve_schema = ResolveBody.model_json_schema(ref_template=_SCHEMAS + "{model}")
    schemas: dict[str, Any] = resolve_schema.pop("$defs")
    schemas["ResolveRequest"] = {**resolve_schema, "title": "ResolveRequest"}
    schemas["Operation"] = _operation_schema()
    schemas["AdminOperation"] = {
        "description": "An operation as operators see it: with its scope.",
        "allOf": [
            _ref("Operation"),
            {"required": ["scope"], "properties": {"scope": {"type": "string"}}},
        ],
    }
    schemas["OperationPage"] = {
        "type": "object",
        "required": ["items", "next_cursor"],
        "properties": {
            "items": {"type": "array", "items": _ref("AdminOperation")},
            "next_cursor": _nullable({"type": "string"}),
        },
    }
    schemas["StoredResponse"] = {
        "type": "object",
        "description": "A receipt: the upstream's status, end-to-end headers and body.",
        "required": ["status", "headers", "body", "body_encoding"],
        "properties": {
            "status": {"type": "integer"},
            "headers": {"type": "object", "additionalProperties": {"type": "string"}},
            "body": {"type": "string"},
            "body_encoding": {"enum": ["utf-8", "base64"]},
        },
    }
    schemas["Problem"] = {
        "type": "object",
        "description": "An RFC 9457 problem; `type` ends with the problem type.",
        "required": ["type", "title", "status", "detail"],
        "properties": {
            "type": {"type": "string", "format": "uri"},
            "title": {"type": "string"},
            "status": {"type": "integer"},
            "detail": {"type": "string"},
            "instance": {"type": "string", "description": "The request's path."},
            "key": {"type": "string", "description": "The normalized key concerned."},
            "operation": {"type": "string", "description": "The key's lookup URL."},
            "state": {"type": "string", "description": "The operation's state."},
            "operation_id": {"type": "string"},
            "safe_to_retry": {
                "type": "boolean",
                "description": "True: the same request with the same key may be sent again.",
            },
        },
    }
    return {
        "schemas": dict(sorted(schemas.items())),
        "parameters": {
            "Key": {
                "name": "key",
                "in": "path",
                "required": True,
                "description": "The normalized key, percent-encoded as one path segment (`/` too).",
                "schema": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": MAX_KEY_LENGTH,
                    "pattern": _PRINTABLE_ASCII,
                },
                "example": "run-77:0:c1",
            },
            "OperationId": {
                "name": "id",
                "in": "path",
                "required": True,
                "schema": {"type": "string", "minLength": 1},
                "example": "op_01JDZ4W6Q8X3M2K7R5T9V0B1C2",
            },
            "RequestId": {
                "name": REQUEST_ID,
                "in": "header",
                "required": False,
                "description": "Echoed back when 1 to 128 printable ASCII characters.",
                "schema": {"type": "string"},
            },
        },
        "headers": {
            "RequestId": _header(
                "The caller's X-Request-Id when usable, else a fresh one; also in the log line."
            ),
            "ETag": _header("The operation's version, for `If-Match` on resolve."),
            "IdempotencyKey": _header("The normalized key concerned."),
            "IdempotencyStatus": _header(
                "The state of the key's operation.", {"enum": [state.value for state in State]}
            ),
            "RetryAfter": _header("Seconds to wait before retrying.", {"type": "integer"}),
        },
        "securitySchemes": {
            "adminToken": {
                "type": "http",
                "scheme": "bearer",
                "description": "The `[admin] token`; the admin endpoints answer 404 without one.",
            },
            "clientToken": {
                "type": "http",
                "scheme": "bearer",
                "description": "A `[[clients]]` token; required (401 otherwise) only when "
                "`[[clients]]` is configured. Without it, the scope comes from "
                "`[idempotency] scope_headers`.",
            },
        },
    }


def _description() -> str:
    proxied = "\n".join(f"- {_problem_line(error)}" for error in _PROXY_PROBLEMS)
    return (
        "The gateway's own endpoints. Every other path is proxied to the configured "
        "route whose prefix matches, so it is not described here: a method the route "
        "protects answers with the upstream's response, a replay of it (with "
        f"`{IDEMPOTENT_REPLAYED}: true`), or one of these `{PROBLEM_JSON}` problems "
        f"(type URIs `{PROBLEM_BASE_URI}<type>`):\n\n{proxied}\n\n"
        "Other methods on the gateway's own paths are not the gateway's either: they "
        "fall through to the proxy. Every response carries `X-Request-Id`."
    )


def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.1 document of the gateway's own endpoints.

    >>> openapi_document()["openapi"]
    '3.1.0'
    """
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Idempotency gateway",
            "version": __version__,
            "description": _description(),
            "license": {"name": "Apache-2.0", "identifier": "Apache-2.0"},
        },
        "paths": _paths(),
        "components": _components(),
    }


@functools.cache
def render() -> str:
    """The document as served and as kept in docs/openapi.json (indent 2, sorted keys)."""
    return json.dumps(openapi_document(), indent=2, sort_keys=True) + "\n"


async def openapi_json(request: web.Request) -> web.Response:
    return web.Response(text=render(), content_type=JSON)


if __name__ == "__main__":
    print(render(), end="")
