"""OpenAPI 3.1 for the gateway's own endpoints, served at `/openapi.json` and kept in docs/.

Only the gateway's own paths are described: proxied routes depend on the
config. Whatever can be taken from the code is: problem types, titles and
statuses come from `gateway.engine.errors`, the resolve body from its pydantic model,
limits from the handlers' constants, so the document cannot drift from them.
`tests/test_openapi.py` runs schemathesis against a real gateway with it.

Regenerate the copy in docs/ with `python -m gateway.web.openapi > docs/openapi.json`.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from aiohttp import web

from gateway import __version__
from gateway.engine.errors import (
    PROBLEM_BASE_URI,
    ClientNotAllowed,
    GatewayError,
    InProgress,
    InvalidKey,
    InvalidRequest,
    KeyMismatch,
    KeyMismatchUnsettled,
    LeaseLost,
    MethodNotAllowed,
    MissingCredentials,
    MissingKey,
    NoRoute,
    NotFound,
    NotResolvable,
    OutcomeUnknown,
    PayloadTooLarge,
    PreconditionFailed,
    QuotaExceeded,
    ReceiptExpired,
    ReceiptNotRetained,
    RequestTimeout,
    RouteSaturated,
    SimilarOperation,
    StoreUnavailable,
    TooEarly,
    Unauthorized,
    UnknownKey,
    UpstreamConnectionLost,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from gateway.engine.headers import (
    IDEMPOTENCY_KEY,
    IDEMPOTENCY_SIMILAR,
    IDEMPOTENCY_STATUS,
    IDEMPOTENT_REPLAYED,
)
from gateway.engine.markers import IDEMPOTENCY_DISTINCT
from gateway.engine.models import State
from gateway.web.admin_view import DEFAULT_LIMIT, MAX_LIMIT
from gateway.web.openapi_components import components, header, ref
from gateway.web.operation_document import HISTORY_PAGE
from gateway.web.operations_view import MAX_RESOLVE_BODY
from gateway.web.problems import PROBLEM_JSON
from gateway.web.request_log import REQUEST_ID

__all__ = ["openapi_document", "openapi_json", "render"]

JSON = "application/json"

_PROXY_PROBLEMS: tuple[type[GatewayError], ...] = (
    MissingKey,
    InvalidKey,
    InvalidRequest,
    Unauthorized,
    MissingCredentials,
    ClientNotAllowed,
    MethodNotAllowed,
    RequestTimeout,
    PayloadTooLarge,
    QuotaExceeded,
    KeyMismatch,
    KeyMismatchUnsettled,
    InProgress,
    SimilarOperation,
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
"""What a proxied request can be refused with (the contract's table and more)."""

# The problem types each gateway operation can answer with. `not-found` and
# `no-route` on key paths: a key that decodes to a line break matches no route
# pattern (aiohttp's 404), and `.`/`..` keys are dot segments removed from the path.
_LOOKUP = (
    InvalidKey,
    InvalidRequest,
    Unauthorized,
    MissingCredentials,
    UnknownKey,
    NotFound,
    NoRoute,
    StoreUnavailable,
)
_RESOLVE = (*_LOOKUP, NotResolvable, TooEarly, PreconditionFailed, PayloadTooLarge)
_ADMIN = (InvalidRequest, Unauthorized, NotFound, NoRoute, StoreUnavailable)
_ADMIN_RESOLVE = (*_ADMIN, NotResolvable, TooEarly, PreconditionFailed, PayloadTooLarge)
_ADMIN_REDACT = (*_ADMIN, PreconditionFailed, PayloadTooLarge)
_ADMIN_ATTACH = (*_ADMIN, NotResolvable, PreconditionFailed, PayloadTooLarge)
_ADMIN_PROBE = (*_ADMIN, NotResolvable)
_RETRY_AFTER: tuple[type[GatewayError], ...] = (TooEarly,)
"""Problems that carry `Retry-After` besides every 503."""


def _problem_line(error: type[GatewayError]) -> str:
    return f"`{error.problem_type}` ({error.status}, `{error.next_action}`): {error.title}"


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
        if status == 503 or any(error in _RETRY_AFTER for error in group):
            headers["Retry-After"] = {"$ref": "#/components/headers/RetryAfter"}
        responses[str(status)] = {
            "description": "; ".join(_problem_line(error) for error in group),
            "headers": headers,
            "content": {
                PROBLEM_JSON: {
                    "schema": {
                        "allOf": [
                            ref("Problem"),
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
    "Cache-Control": header("Always `no-store`.", {"const": "no-store"}),
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
_TOO_EARLY = (
    "`not_applied` releases the key, so that a retry is sent again. While the tool may "
    "still be applying the last send (until the operation's `not_applied_allowed_at`: "
    "the route's `not_applied_after` past the later of the attempt's lease expiry and its "
    "send plus the route's `timeout`), it answers 409 `too-early` with `allowed_at`, "
    "`last_send_age` and `Retry-After`, and the operation stays `unknown`."
)
_RESOLVE_BODY = {
    "required": True,
    "description": f"At most {MAX_RESOLVE_BODY} bytes; a `not_applied` outcome has no `response`.",
    "content": {JSON: {"schema": ref("ResolveRequest")}},
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


_WORKER_COUNTS = {
    "serving_workers": {"type": "integer", "description": "Workers serving now."},
    "workers": {"type": "integer", "description": "`[server] workers`."},
}


_NO_STORE = {"Cache-Control": header("Always `no-store`.", {"const": "no-store"})}
_ADMIN_SECURITY: list[dict[str, list[str]]] = [{"adminToken": []}]
_ADMIN_ACTOR_PARAMETER = {"$ref": "#/components/parameters/AdminActor"}


def _query(name: str, description: str, schema: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {"name": name, "in": "query", "description": description, "schema": schema, **more}


def _limit(maximum: int, default: int) -> dict[str, Any]:
    schema = {"type": "integer", "minimum": 1, "maximum": maximum, "default": default}
    return _query("limit", "At most this many items.", schema)


_CURSOR = _query("cursor", "The `next_cursor` of the previous page (opaque).", {"type": "string"})


def _admin(
    method: str,
    summary: str,
    operation_id: str,
    parameters: list[dict[str, Any]],
    responses: dict[str, Any],
    errors: tuple[type[GatewayError], ...],
    **more: Any,
) -> dict[str, Any]:
    """One admin operation: the admin token, a request id, its answers and problems."""
    return {
        method: {
            "summary": summary,
            "operationId": operation_id,
            "security": _ADMIN_SECURITY,
            "parameters": [*parameters, _REQUEST_ID_PARAMETER],
            **more,
            "responses": {**responses, **_problems(errors)},
        }
    }


def _admin_paths() -> dict[str, Any]:
    """History, verification and probes: what an operator settles an operation with."""
    op_id = {"$ref": "#/components/parameters/OperationId"}
    route = {
        "name": "route",
        "in": "path",
        "required": True,
        "description": "The route's name.",
        "schema": {"type": "string", "minLength": 1},
        "example": "tickets",
    }
    job = _ok("The job, as far as it got.", ref("ProbeJob"), _NO_STORE)
    return {
        "/admin/operations/{id}/history": _admin(
            "get",
            "A page of an operation's history, oldest first",
            "adminOperationHistory",
            [
                op_id,
                _query(
                    "after",
                    "Events after this `seq` (the previous page's `next`).",
                    {"type": "integer", "minimum": 0, "default": 0},
                ),
                _limit(1000, HISTORY_PAGE),
            ],
            {"200": _ok("One page of events.", ref("HistoryPage"), _NO_STORE)},
            _ADMIN,
        ),
        "/admin/operations/{id}/requests": _admin(
            "get",
            "The key's request log: every request that carried it, answered about it",
            "adminOperationRequests",
            [op_id],
            {"200": _ok("The lines kept and the counts.", ref("RequestLog"), _NO_STORE)},
            _ADMIN,
        ),
        "/admin/operations/{id}/verify": _admin(
            "get",
            "Check an operation's hash chain",
            "adminVerifyOperation",
            [op_id],
            {"200": _ok("What the check found.", ref("ChainReport"), _NO_STORE)},
            _ADMIN,
            description="An edited, dropped or reordered event breaks the chain: `ok` is "
            "false and `broken` names the first such event. Without a key, the chain "
            "detects accidental or naive edits only.",
        ),
        "/admin/verify": _admin(
            "get",
            "Check every operation's hash chain, a page of operations at a time",
            "adminVerifyAll",
            [_limit(MAX_LIMIT, DEFAULT_LIMIT), _CURSOR],
            {"200": _ok("What the check of one page found.", ref("VerifyPage"), _NO_STORE)},
            _ADMIN,
        ),
        "/admin/operations/{id}/probe": _admin(
            "post",
            "Probe an `unknown` operation now",
            "adminProbeOperation",
            [op_id],
            {
                "200": _ok(
                    "The operation after the probe's answer (settled, or still `unknown` "
                    "with the verdict in its history).",
                    ref("AdminOperation"),
                    _OPERATION_HEADERS,
                )
            },
            _ADMIN_PROBE,
            description="Asks the route's probe once, whatever its backoff says. 409 "
            "`not-resolvable` when the operation is not `unknown`; 400 `invalid-request` "
            "when its route has no probe.",
        ),
        "/admin/operations/probe": _admin(
            "post",
            "Probe every `unknown` operation of a route (a background job)",
            "adminProbeRoute",
            [
                _query(
                    "route",
                    "The route's name; 400 when there is none such or it has no probe.",
                    {"type": "string"},
                    required=True,
                )
            ],
            {
                "202": _ok(
                    "The job started, or the route's job already running.",
                    ref("ProbeJob"),
                    {
                        **_NO_STORE,
                        "Location": header("The job's URL (`/admin/probe-jobs/<route>`)."),
                    },
                )
            },
            _ADMIN,
            description="Each operation is probed once, a few at a time (never more than "
            "the route's `max_concurrency`). One job per route: a request while it runs "
            "answers it.",
        ),
        "/admin/probe-jobs/{route}": _admin(
            "get",
            "A route's bulk probe job",
            "adminProbeJob",
            [route],
            {"200": job},
            _ADMIN,
            description="404 when this process has started none for the route.",
        ),
        "/admin/probes/{route}": _admin(
            "get",
            "What a route's probe can see: its applies_to and every kind's calibration",
            "adminProbe",
            [route],
            {"200": _ok("The route's probe.", ref("ProbeKinds"), _NO_STORE)},
            _ADMIN,
            description='A probe\'s "not found" releases only requests its `applies_to` '
            "covers, of a kind it is calibrated for (it found a recent completed one and did "
            "not find a key never used). 404 for no such route; 400 when it has no probe.",
        ),
        "/admin/probes/{route}/check": _admin(
            "post",
            "Calibrate the route's probe for every kind of its requests now",
            "adminCheckProbe",
            [route],
            {"200": _ok("One row per kind.", ref("ProbeCheck"), _NO_STORE)},
            _ADMIN,
            description="What `idempotency-gateway probes check ROUTE` prints. A blind kind "
            "stays blind whatever the check finds: only `trust` re-enables it.",
        ),
        "/admin/probes/{route}/trust": _admin(
            "post",
            "Re-enable a blind probe for one kind, with a note",
            "adminTrustProbe",
            [route],
            {"200": _ok("The kind's calibration now.", ref("ProbeKindState"), _NO_STORE)},
            _ADMIN,
            requestBody={
                "required": True,
                "content": {JSON: {"schema": ref("TrustRequest")}},
            },
            description="The calibration runs again: if it passes, the kind is calibrated; "
            "if it still fails, the trust is an override (`trusted`) that ends after 24 "
            "hours. 400 for a kind the probe's `applies_to` does not cover.",
        ),
    }


def _readyz() -> Any:
    """Ready: the store answers. With workers, both counts, and a JSON 503 `degraded` once
    fewer than all have served for a while (a store outage is the problem document)."""
    ready = {"status": {"const": "ready"}, **_WORKER_COUNTS}
    path = _simple_get(
        "The store is reachable and migrated (and, with workers, all of them serve)",
        _ok("Ready.", {"type": "object", "required": ["status"], "properties": ready}),
        (StoreUnavailable,),
    )
    degraded = {
        "type": "object",
        "required": ["status", "serving_workers", "workers"],
        "properties": {"status": {"const": "degraded"}, **_WORKER_COUNTS},
    }
    unavailable = path["get"]["responses"]["503"]
    unavailable["description"] += (
        "; or, with workers, fewer than all of them have served for 10 s (`degraded`)"
    )
    unavailable["content"][JSON] = {"schema": degraded}
    return path


def _paths() -> dict[str, Any]:
    key = {"$ref": "#/components/parameters/Key"}
    op_id = {"$ref": "#/components/parameters/OperationId"}
    scoped: list[dict[str, list[str]]] = [{}, {"clientToken": []}]
    admin = _ADMIN_SECURITY
    operation = ref("Operation")
    admin_operation = ref("AdminOperation")
    return {
        "/healthz": _simple_get(
            "The process is alive",
            _ok("Alive.", {"type": "object", "properties": {"status": {"const": "ok"}}}),
            (),
        ),
        "/readyz": _readyz(),
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
                "description": _TOO_EARLY,
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
                        "name": "route",
                        "in": "query",
                        "description": "Only this route's operations.",
                        "schema": {"type": "string"},
                    },
                    {
                        "name": "key",
                        "in": "query",
                        "description": "Only this key's operations, in every scope that used it "
                        "(exact match).",
                        "schema": {"type": "string"},
                    },
                    {
                        "name": "q",
                        "in": "query",
                        "description": "Only operations whose key, id or forwarded key starts "
                        "with this text (`%` and `_` are literal).",
                        "schema": {"type": "string"},
                    },
                    {
                        "name": "older_than",
                        "in": "query",
                        "description": "Only operations created at least this long ago "
                        "(a duration: `90s`, `10m`, `24h`), on the store's clock.",
                        "schema": {"type": "string"},
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
                    "200": _ok("One page.", ref("OperationPage")),
                    **_problems(_ADMIN),
                },
            }
        },
        "/admin/overview": {
            "get": {
                "summary": "Counts of operations by state, and the route names",
                "operationId": "adminOverview",
                "security": admin,
                "parameters": [_REQUEST_ID_PARAMETER],
                "responses": {
                    "200": _ok("The overview.", ref("AdminOverview")),
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
                "description": _TOO_EARLY + " An admin may release it sooner with "
                "`force: true`, which the history records.",
                "operationId": "adminResolveOperation",
                "security": admin,
                "parameters": [op_id, _IF_MATCH, _ADMIN_ACTOR_PARAMETER, _REQUEST_ID_PARAMETER],
                "requestBody": _RESOLVE_BODY,
                "responses": {
                    "200": _ok("The settled operation.", admin_operation, _OPERATION_HEADERS),
                    **_problems(_ADMIN_RESOLVE),
                },
            }
        },
        "/admin/operations/{id}/receipt": {
            "post": {
                "summary": "Attach the receipt an `applied` settlement went without, once",
                "description": "For an operation completed by an owner's or an operator's "
                "`applied` without a response (its retries get 409 `receipt-not-retained`): "
                "the response retries get from now on. Once; any other operation is 409 "
                "`not-resolvable`. The history records who attached it and the note.",
                "operationId": "adminAttachReceipt",
                "security": admin,
                "parameters": [op_id, _IF_MATCH, _ADMIN_ACTOR_PARAMETER, _REQUEST_ID_PARAMETER],
                "requestBody": {
                    "required": True,
                    "content": {JSON: {"schema": ref("AttachRequest")}},
                },
                "responses": {
                    "200": _ok(
                        "The operation with its receipt.", admin_operation, _OPERATION_HEADERS
                    ),
                    **_problems(_ADMIN_ATTACH),
                },
            }
        },
        "/admin/operations/{id}/redact": {
            "post": {
                "summary": "Erase an operation's recorded request and receipt (personal data)",
                "description": "In any state: the recorded request's body (or arguments) "
                "and a receipt's headers and body are erased; a completed operation stays "
                "completed (a retry then gets 409 `receipt-not-retained`) and the key stays "
                "used. The history records who erased what and why (the reason is erasable "
                "too).",
                "operationId": "adminRedactOperation",
                "security": admin,
                "parameters": [op_id, _IF_MATCH, _ADMIN_ACTOR_PARAMETER, _REQUEST_ID_PARAMETER],
                "requestBody": {
                    "required": True,
                    "content": {JSON: {"schema": ref("RedactRequest")}},
                },
                "responses": {
                    "200": _ok("The redacted operation.", admin_operation, _OPERATION_HEADERS),
                    **_problems(_ADMIN_REDACT),
                },
            }
        },
        **_admin_paths(),
    }


def _description() -> str:
    proxied = "\n".join(f"- {_problem_line(error)}" for error in _PROXY_PROBLEMS)
    return (
        "The gateway's own endpoints. Every other path is proxied to the configured "
        "route whose prefix matches, so it is not described here: a method the route "
        "protects answers with the upstream's response, a replay of it (with "
        f"`{IDEMPOTENT_REPLAYED}: true`), or one of these `{PROBLEM_JSON}` problems "
        f"(type URIs `{PROBLEM_BASE_URI}<type>`):\n\n{proxied}\n\n"
        f"A protected request may carry `{IDEMPOTENCY_DISTINCT}: ?1`, a deliberate second "
        "effect: it is then never refused `similar-operation` (the marker is the "
        "gateway's: not forwarded, not part of the fingerprint). A live answer to a new "
        "key whose request matches a completed operation under another key carries "
        f"`{IDEMPOTENCY_SIMILAR}: <its lookup URL>`.\n\n"
        "Other methods on the gateway's own paths get `405 method-not-allowed` with an "
        "`Allow` header. With `[admin] listen` set, the admin endpoints are "
        "served only on that address (404 on the main one), which serves nothing else "
        "but `/healthz`, `/readyz` and `/metrics`. Every response carries `X-Request-Id`."
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
        "components": components(),
    }


@functools.cache
def render() -> str:
    """The document as served and as kept in docs/openapi.json (indent 2, sorted keys)."""
    return json.dumps(openapi_document(), indent=2, sort_keys=True) + "\n"


async def openapi_json(request: web.Request) -> web.Response:
    return web.Response(text=render(), content_type=JSON)


if __name__ == "__main__":
    print(render(), end="")
