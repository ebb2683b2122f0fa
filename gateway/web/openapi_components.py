"""The `components` of the gateway's OpenAPI document: schemas, parameters, headers, security.

Kept apart from `gateway.web.openapi` (the paths and the handler) so each stays one
concept. The request bodies' schemas are pydantic's own (`ResolveBody`,
`RedactBody`), so the document and the validation cannot drift; the operation JSON's schema follows
`gateway.web.operation_json`, which schemathesis checks against real answers.
"""

from __future__ import annotations

from typing import Any

from gateway.engine.keys import MAX_KEY_LENGTH
from gateway.engine.models import State
from gateway.web.admin_view import RedactBody
from gateway.web.request_log import REQUEST_ID
from gateway.web.resolve_body import ResolveBody

__all__ = ["components", "header", "nullable", "ref"]

SCHEMAS = "#/components/schemas/"
_PRINTABLE_ASCII = "^[ -~]+$"


def ref(name: str) -> dict[str, str]:
    return {"$ref": SCHEMAS + name}


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


def _timestamp(description: str) -> dict[str, Any]:
    return {"type": "string", "format": "date-time", "description": description}


def header(description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"description": description, "schema": schema or {"type": "string"}}


def _operation_schema() -> dict[str, Any]:
    states = [state.value for state in State]
    return {
        "type": "object",
        "description": "What the gateway knows about one key's effect (the operation JSON).",
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
            "expires_at": nullable(_timestamp("When the receipt's body is dropped.")),
            "forgotten_at": nullable(_timestamp("When the whole record is dropped.")),
            "response": nullable(ref("StoredResponse")),
            "response_status": nullable({"type": "integer"}),
            "body_retained": nullable(
                {
                    "type": "boolean",
                    "description": "For a completed operation: whether its body is held now "
                    "and can be replayed (false once retention dropped it, for a response "
                    "too large to keep, after a redaction); null in other states.",
                }
            ),
            "resolution": nullable(
                {
                    "type": "object",
                    "required": ["by", "at", "note"],
                    "properties": {
                        "by": {"enum": ["upstream", "probe", "owner", "admin"]},
                        "at": _timestamp("When the outcome was settled."),
                        "note": nullable({"type": "string"}),
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
                        "status": nullable({"type": "integer"}),
                        "body_sha256": nullable({"type": "string"}),
                    },
                },
            },
            "lease_expires_at": nullable(_timestamp("The in-flight lease's expiry.")),
            "fencing_token": {"type": "integer"},
            "safe_to_retry": {
                "type": "boolean",
                "description": "False for `unknown`, and for `completed` without its body.",
            },
            "operation": {"type": "string", "description": "This operation's lookup URL."},
        },
    }


def components() -> dict[str, Any]:
    resolve_schema = ResolveBody.model_json_schema(ref_template=SCHEMAS + "{model}")
    schemas: dict[str, Any] = resolve_schema.pop("$defs")
    schemas["ResolveRequest"] = {**resolve_schema, "title": "ResolveRequest"}
    schemas["RedactRequest"] = {**RedactBody.model_json_schema(), "title": "RedactRequest"}
    schemas["Operation"] = _operation_schema()
    schemas["AdminOperation"] = {
        "description": "An operation as operators see it: with its scope and the key "
        "its upstream saw (`null` on a route with `forward_key = false`).",
        "allOf": [
            ref("Operation"),
            {
                "required": ["scope", "forwarded_key"],
                "properties": {
                    "scope": {"type": "string"},
                    "forwarded_key": nullable({"type": "string"}),
                },
            },
        ],
    }
    schemas["AdminOverview"] = {
        "type": "object",
        "description": "The operator console's first screen: counts by state, route names.",
        "required": ["counts", "routes"],
        "properties": {
            "counts": {
                "type": "object",
                "required": [state.value for state in State],
                "properties": {state.value: {"type": "integer"} for state in State},
            },
            "routes": {"type": "array", "items": {"type": "string"}},
        },
    }
    schemas["OperationPage"] = {
        "type": "object",
        "required": ["items", "next_cursor"],
        "properties": {
            "items": {"type": "array", "items": ref("AdminOperation")},
            "next_cursor": nullable({"type": "string"}),
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
            "request_id": {
                "type": "string",
                "description": "The request's `X-Request-Id`: finds its log line, which "
                "holds what the problem does not say (hosts, driver errors).",
            },
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
                "description": "The normalized key, percent-encoded as one path segment "
                "(`/` too). The keys `.` and `..` are dot segments, which the path "
                "resolution removes, encoded or not: they cannot be looked up (404 no-route).",
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
            "RequestId": header(
                "The caller's X-Request-Id when usable, else a fresh one; also in the log line."
            ),
            "ETag": header("The operation's version, for `If-Match` on resolve."),
            "IdempotencyKey": header("The normalized key concerned."),
            "IdempotencyStatus": header(
                "The state of the key's operation.", {"enum": [state.value for state in State]}
            ),
            "RetryAfter": header("Seconds to wait before retrying.", {"type": "integer"}),
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
