"""The `components` of the gateway's OpenAPI document: schemas, parameters, headers, security.

Kept apart from `gateway.web.openapi` (the paths and the handler) so each stays one
concept. The request bodies' schemas are pydantic's own (`ResolveBody`,
`RedactBody`), so the document and the validation cannot drift; the operation JSON's schema follows
`gateway.web.operation_json` (the record) and `gateway.web.operation_document` (its history,
recorded request and release window), which schemathesis checks against real answers.
"""

from __future__ import annotations

from typing import Any

from gateway.engine.keys import MAX_KEY_LENGTH
from gateway.engine.models import RECEIPT_SOURCES, State
from gateway.engine.request_lines import FIRST, LAST, LOGGED_OUTCOMES
from gateway.web.admin_auth import ADMIN_ACTOR
from gateway.web.admin_view import RedactBody
from gateway.web.operation_document import HISTORY_PAGE
from gateway.web.probes_view import ProbeCheck, ProbeKinds, ProbeKindState, TrustBody
from gateway.web.request_log import REQUEST_ID
from gateway.web.resolve_body import AttachBody, ResolveBody

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


def _record_schema() -> dict[str, Any]:
    states = [state.value for state in State]
    return {
        "type": "object",
        "description": "What the gateway knows about one key's effect: the record (as each "
        "item of an operator's listing shows it; one operation's JSON adds its history).",
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
            "fingerprint": {"type": "string", "examples": ["v2:hmac-sha256:9f86d08..."]},
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
            "lease_expires_at": nullable(
                _timestamp(
                    "The attempt's lease expiry (after the attempt, its last one: a grace "
                    "counts from it). Null once `completed`."
                )
            ),
            "fencing_token": {"type": "integer"},
            "safe_to_retry": {
                "type": "boolean",
                "description": "False for `unknown`, and for `completed` without its body.",
            },
            "operation": {"type": "string", "description": "This operation's lookup URL."},
        },
    }


EVENT_TYPES = (
    "claimed",
    "sent",
    "answered",
    "timed-out",
    "connection-lost",
    "lease-expired",
    "probe",
    "resolved",
    "receipt-attached",
    "released",
    "redacted",
    "expired",
    "truncated",
)
"""The kinds of event an operation's history holds (`gateway.engine.lifecycle_events`)."""


def _operation_schema() -> dict[str, Any]:
    """One operation's JSON, as its owner reads it: the record, its history and when a
    `not_applied` resolve is accepted."""
    window = " Null unless the operation is `unknown` or `in_flight`."
    return {
        "description": "What the gateway knows about one key's effect (the operation JSON): "
        "the record, its history, where its receipt came from and, while the tool may "
        "still be applying the last send, until when.",
        "allOf": [
            ref("OperationRecord"),
            {
                "required": [
                    "history",
                    "history_next",
                    "receipt_source",
                    "requests",
                    "last_send_age",
                    "may_apply_until",
                    "not_applied_allowed_at",
                ],
                "properties": {
                    "history": {
                        "type": "array",
                        "maxItems": HISTORY_PAGE,
                        "description": f"The first {HISTORY_PAGE} events, oldest first "
                        "(`history_next` pages on). An owner sees an admin's events as actor "
                        "`admin`, without the note unless it was shared.",
                        "items": ref("HistoryEvent"),
                    },
                    "history_next": nullable(
                        {
                            "type": "integer",
                            "description": "The `seq` to page on from "
                            "(`GET /admin/operations/{id}/history?after=`); null: no more.",
                        }
                    ),
                    "receipt_source": nullable(
                        {
                            "enum": sorted(set(RECEIPT_SOURCES.values())),
                            "description": "Who made a completed operation's receipt: the "
                            "upstream's answer, a probe's, or an operator's statement; null "
                            "in other states.",
                        }
                    ),
                    "requests": ref("RequestCounts"),
                    "last_send_age": nullable(
                        {
                            "type": "number",
                            "minimum": 0,
                            "description": "Seconds since the current attempt's last "
                            "possible send, on the server's clocks." + window,
                        }
                    ),
                    "may_apply_until": nullable(
                        _timestamp(
                            "Until when the tool may still apply that send: the route's "
                            "`not_applied_after` past the later of the attempt's lease expiry "
                            "and its send plus the route's `timeout`." + window
                        )
                    ),
                    "not_applied_allowed_at": nullable(
                        _timestamp(
                            "From when a `not_applied` resolve is accepted (the same instant "
                            "as `may_apply_until`); before it, 409 `too-early`. Null unless "
                            "the operation is `unknown`."
                        )
                    ),
                },
            },
        ],
    }


def _history_event_schema() -> dict[str, Any]:
    nullable_string = nullable({"type": "string"})
    return {
        "type": "object",
        "description": "One event of an operation's history: append-only and hash-chained "
        "(`GET /admin/operations/{id}/verify`). Besides the members every event has, each "
        "type carries its own (`claimed`: attempt, token; `sent`: forwarded_key; `answered`: "
        "status; `timed-out`, `connection-lost`, `lease-expired`, `released`: detail; "
        "`probe`: verdict, status, detail; `resolved`: outcome, by, note, force, "
        "share_with_owner; `redacted`: reason, erased; `expired`: erased). An erased note "
        "or reason reads `<name>_redacted: true`.",
        "required": ["seq", "type", "at", "actor", "version"],
        "properties": {
            "seq": {"type": "integer", "minimum": 1, "description": "1, 2, 3... per operation."},
            "type": {"enum": list(EVENT_TYPES)},
            "at": _timestamp("When it was recorded, on the store's clock."),
            "actor": {
                "type": "string",
                "description": "`gateway`, `probe`, `owner`, `admin` or `admin:<name>` "
                f"(from `{ADMIN_ACTOR}`).",
            },
            "version": {
                "type": "integer",
                "description": "The operation's version after the write that recorded it.",
            },
            "attempt": {"type": "integer", "description": "The attempt it concerns."},
            "token": {"type": "integer", "description": "The attempt's fencing token."},
            "forwarded_key": nullable_string,
            "status": nullable({"type": "integer"}),
            "jsonrpc": {"enum": ["result", "error"], "description": "MCP: what answered."},
            "detail": {"type": "string"},
            "verdict": {
                "type": "string",
                "description": "A probe's: applied, not_applied, not_applied_too_soon, "
                "inconclusive, superseded...",
            },
            "outcome": {"enum": ["applied", "not_applied"]},
            "by": {"type": "string", "description": "`owner`, `admin` or `probe`."},
            "force": {
                "type": "boolean",
                "description": "An admin released it although the last send might still "
                "be applied.",
            },
            "share_with_owner": {"type": "boolean"},
            "note": nullable_string,
            "note_redacted": {"const": True},
            "reason": {"type": "string"},
            "reason_redacted": {"const": True},
            "erased": {"type": "array", "items": {"enum": ["request", "receipt", "probes"]}},
            "reconstructed": {
                "const": True,
                "description": "Rebuilt by migration 5 from a record older than histories.",
            },
        },
    }


def _recorded_request_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "description": "What was sent, as recorded with the first attempt (values named by "
        "the route's `redact_request` replaced), for an operator to find the effect.",
        "properties": {
            "method": {"type": "string", "description": "`tools/call` on an MCP route."},
            "target": {"type": "string", "description": "The path and query sent."},
            "content_type": nullable({"type": "string"}),
            "size": {"type": "integer", "minimum": 0, "description": "The body's bytes."},
            "digest": {
                "type": "string",
                "description": "`hmac-sha256:` and 32 hex digits: an HMAC, keyed by the scope "
                "secret and the scope, of the body as recorded (after redaction), or of the "
                "body as sent when it is not kept; tells bodies apart, confirms no guess. "
                "Records made before this version carry `sha256` instead.",
            },
            "body": nullable({"type": "string"}),
            "body_encoding": {"enum": ["utf-8", "base64"]},
            "body_gone": nullable(
                {
                    "enum": ["too_large", "unparsed", "redacted", "expired"],
                    "description": "Why `body` (or `arguments`) is not kept: larger than "
                    "`record_request_max`, a format `redact_request` cannot read (kept as "
                    "size and digest only unless the route sets `record_raw`), erased by a "
                    "redaction, or dropped at retention.",
                }
            ),
            "tool": nullable({"type": "string", "description": "MCP routes: the tool called."}),
            "arguments": {"description": "MCP routes: its arguments, or null."},
        },
    }


def _admin_schemas() -> dict[str, Any]:
    """The history, verification and bulk probe answers of the admin API."""
    broken = {
        "type": "object",
        "required": ["seq", "reason"],
        "properties": {"seq": {"type": "integer"}, "reason": {"type": "string"}},
    }
    return {
        "HistoryPage": {
            "type": "object",
            "required": ["items", "next"],
            "properties": {
                "items": {"type": "array", "items": ref("HistoryEvent")},
                "next": nullable(
                    {"type": "integer", "description": "The `after` of the next page."}
                ),
            },
        },
        "ChainReport": {
            "type": "object",
            "description": "One operation's hash chain checked: intact (`ok`), or the first "
            "event that is not. An event whose erasable values were erased is `redacted`, "
            "not broken.",
            "required": ["id", "key", "scope", "ok", "events", "redacted", "broken"],
            "properties": {
                "id": {"type": "string"},
                "key": {"type": "string"},
                "scope": {"type": "string"},
                "ok": {"type": "boolean"},
                "events": {"type": "integer", "minimum": 0},
                "redacted": {"type": "array", "items": {"type": "integer"}},
                "broken": nullable(broken),
            },
        },
        "VerifyPage": {
            "type": "object",
            "description": "A page of operations whose chains were checked.",
            "required": ["checked", "redacted_events", "broken", "next_cursor"],
            "properties": {
                "checked": {"type": "integer", "minimum": 0},
                "redacted_events": {"type": "integer", "minimum": 0},
                "broken": {
                    "type": "array",
                    "items": {
                        "allOf": [
                            broken,
                            {
                                "required": ["id", "key", "scope"],
                                "properties": {
                                    "id": {"type": "string"},
                                    "key": {"type": "string"},
                                    "scope": {"type": "string"},
                                },
                            },
                        ]
                    },
                },
                "next_cursor": nullable({"type": "string"}),
                "checkpoints": {
                    "type": "object",
                    "description": "On the first page (no cursor): the chain of signed "
                    "checkpoints of history heads (with a history key; `count` 0 without).",
                    "required": ["ok", "count", "latest_at", "broken"],
                    "properties": {
                        "ok": {"type": "boolean"},
                        "count": {"type": "integer", "minimum": 0},
                        "latest_at": nullable({"type": "string", "format": "date-time"}),
                        "broken": nullable(
                            {
                                "type": "object",
                                "required": ["checkpoint", "reason"],
                                "properties": {
                                    "checkpoint": {"type": "integer"},
                                    "reason": {"type": "string"},
                                },
                            }
                        ),
                    },
                },
            },
        },
        "ProbeJob": {
            "type": "object",
            "description": "A route's bulk probe: every `unknown` operation of the route "
            "probed once, a few at a time. One job per route and process.",
            "required": [
                "route",
                "job",
                "state",
                "total",
                "probed",
                "applied",
                "not_applied",
                "still_unknown",
                "failed",
                "started_at",
                "finished_at",
            ],
            "properties": {
                "route": {"type": "string"},
                "job": {"type": "string", "description": "This job's URL."},
                "state": {"enum": ["running", "done"]},
                "total": {"type": "integer", "minimum": 0},
                "probed": {"type": "integer", "minimum": 0},
                "applied": {"type": "integer", "minimum": 0},
                "not_applied": {"type": "integer", "minimum": 0},
                "still_unknown": {"type": "integer", "minimum": 0},
                "failed": {"type": "integer", "minimum": 0},
                "started_at": _timestamp("When the job started."),
                "finished_at": nullable(_timestamp("When it finished.")),
            },
        },
    }


def _resolve_request_schema() -> tuple[dict[str, Any], dict[str, Any]]:
    """The resolve body's schema (pydantic's own) and its `$defs`, with what the model's
    fields do not say themselves."""
    schema = ResolveBody.model_json_schema(ref_template=SCHEMAS + "{model}")
    definitions: dict[str, Any] = schema.pop("$defs")
    properties = schema["properties"]
    admin_only = " Admin endpoints only: an owner's resolve with it is 400 `invalid-request`."
    properties["force"]["description"] = (
        "Release (`not_applied`) although the tool may still be applying the last send, "
        "instead of 409 `too-early`; the history records it." + admin_only
    )
    properties["share_with_owner"]["description"] = (
        "The operation's owner may read the note." + admin_only
    )
    return {**schema, "title": "ResolveRequest"}, definitions


def _probe_schemas() -> dict[str, Any]:
    """What `/admin/probes/{route}` answers and takes: the pydantic models that also make
    the JSON (`gateway.web.probes_view`)."""
    found: dict[str, Any] = {}
    for model, title in (
        (ProbeKinds, "ProbeKinds"),
        (ProbeCheck, "ProbeCheck"),
        (TrustBody, "TrustRequest"),
        (ProbeKindState, "ProbeKindState"),
    ):
        schema = model.model_json_schema(ref_template=SCHEMAS + "{model}")
        found.update(schema.pop("$defs", {}))
        found[title] = {**schema, "title": title}
    return found


def _request_log_schemas() -> dict[str, Any]:
    """The key's request log (`gateway.engine.request_lines`) and its counts."""
    count = {"type": "integer", "minimum": 0}
    counts = {
        "type": "object",
        "description": "Requests that carried the operation's key, answered about it: all "
        "of them, the replays, and the refusals (answered 4xx by the gateway, not sent).",
        "required": ["total", "replays", "refusals"],
        "properties": {"total": count, "replays": count, "refusals": count},
    }
    line = {
        "type": "object",
        "required": ["seq", "request_id", "at", "status", "outcome", "replayed", "problem"],
        "properties": {
            "seq": {"type": "integer", "minimum": 1},
            "request_id": {"type": "string", "description": "`X-Request-Id` as answered"},
            "at": _timestamp("When it was answered."),
            "status": {
                "type": "integer",
                "description": "The status answered; an MCP refusal's (a result in a 200) "
                "is its problem's",
            },
            "outcome": {"enum": list(LOGGED_OUTCOMES)},
            "replayed": {"type": "boolean"},
            "problem": nullable({"type": "string", "description": "the problem type's name"}),
        },
    }
    log = {
        "description": f"The first {FIRST} and the last {LAST} lines, oldest first, written "
        "at most once a second; `omitted` lines between were counted, not kept.",
        "allOf": [
            ref("RequestCounts"),
            {
                "type": "object",
                "required": ["items", "omitted"],
                "properties": {
                    "items": {"type": "array", "items": ref("RequestLine")},
                    "omitted": count,
                },
            },
        ],
    }
    return {"RequestCounts": counts, "RequestLine": line, "RequestLog": log}


def components() -> dict[str, Any]:
    resolve_schema, schemas = _resolve_request_schema()
    schemas["ResolveRequest"] = resolve_schema
    schemas["RedactRequest"] = {**RedactBody.model_json_schema(), "title": "RedactRequest"}
    schemas.update(_request_log_schemas())
    attach = AttachBody.model_json_schema(ref_template=SCHEMAS + "{model}")
    schemas.update(attach.pop("$defs", {}))
    schemas["AttachRequest"] = {**attach, "title": "AttachRequest"}
    schemas["OperationRecord"] = _record_schema()
    schemas["Operation"] = _operation_schema()
    schemas["HistoryEvent"] = _history_event_schema()
    schemas["RecordedRequest"] = _recorded_request_schema()
    scoped = {
        "scope": {"type": "string"},
        "forwarded_key": nullable({"type": "string"}),
    }
    schemas["AdminOperation"] = {
        "description": "An operation as operators see it: with its scope, the key its "
        "upstream saw (`null` on a route with `forward_key = false`), the recorded request "
        "and whether its route has a probe.",
        "allOf": [
            ref("Operation"),
            {
                "required": ["scope", "forwarded_key", "request", "probe_available"],
                "properties": {
                    **scoped,
                    "request": nullable(ref("RecordedRequest")),
                    "probe_available": {
                        "type": "boolean",
                        "description": "The route has a probe (`POST .../probe` asks it).",
                    },
                },
            },
        ],
    }
    schemas["AdminOperationItem"] = {
        "description": "One operation of an operator's listing: the record, its scope and "
        "the key its upstream saw (`GET /admin/operations/{id}` has the rest).",
        "allOf": [
            ref("OperationRecord"),
            {"required": ["scope", "forwarded_key"], "properties": scoped},
        ],
    }
    schemas.update(_admin_schemas())
    schemas.update(_probe_schemas())
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
            "items": {"type": "array", "items": ref("AdminOperationItem")},
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
            "next_action": {
                "enum": ["retry", "wait", "reconcile", "fix-request", "stop"],
                "description": "The one thing to do now, the same for every problem of a "
                "type: send the same request again (`retry`), wait for the first attempt "
                "(`wait`), look the outcome up and settle it, never resend (`reconcile`), "
                "change the request (`fix-request`), or give up here (`stop`).",
            },
            "similar_operation": {
                "type": "object",
                "description": "`similar-operation` only: the operation with the same "
                "request under another key, which is what to settle.",
                "required": ["key", "state", "operation", "operation_id"],
                "properties": {
                    "key": {"type": "string"},
                    "state": {"enum": ["in_flight", "unknown", "completed", "released"]},
                    "operation": {"type": "string", "description": "Its lookup URL."},
                    "operation_id": {"type": "string"},
                },
            },
            "allowed_at": _timestamp(
                "`too-early` only: from when a `not_applied` resolve is accepted."
            ),
            "last_send_age": {
                "type": "number",
                "description": "`too-early` only: seconds since the attempt's last send.",
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
            "AdminActor": {
                "name": ADMIN_ACTOR,
                "in": "header",
                "required": False,
                "description": "Who acts, recorded in the history as `admin:<name>` "
                "(without it: `admin`); 1 to 64 printable ASCII characters, else 400.",
                "schema": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 64,
                    "pattern": _PRINTABLE_ASCII,
                },
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
            "RetryAfter": header(
                "Seconds to wait before retrying (`too-early`: until `allowed_at`).",
                {"type": "integer"},
            ),
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
