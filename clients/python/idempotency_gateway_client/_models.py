"""What the gateway answers: proxied responses and the operation JSON of a lookup.

The operation JSON is parsed with pydantic at this boundary; fields the
contract fixes are typed, anything a newer gateway adds is kept as an extra
field, never refused.
"""

from __future__ import annotations

import base64
import json as jsonlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "Evidence",
    "Operation",
    "OperationState",
    "Resolution",
    "Response",
    "SimilarTwin",
    "StoredResponse",
]

OperationState = Literal["in_flight", "completed", "unknown", "released"]


class StoredResponse(BaseModel):
    """A receipt: the upstream's status, headers and body as the gateway stored them.

    >>> receipt.status, receipt.body_bytes()
    (201, b'{"id": "T-1"}')
    """

    model_config = ConfigDict(frozen=True, extra="allow")

    status: int
    headers: dict[str, str] = Field(default_factory=dict)
    body: str = ""
    body_encoding: Literal["utf-8", "base64"] = "utf-8"

    def body_bytes(self) -> bytes:
        """The body as the upstream sent it (decoded from base64 when it was not UTF-8)."""
        if self.body_encoding == "base64":
            return base64.b64decode(self.body)
        return self.body.encode("utf-8")

    def body_json(self) -> Any:
        """The body parsed as JSON."""
        return jsonlib.loads(self.body_bytes())


class Resolution(BaseModel):
    """Who settled the operation (`upstream`, `probe`, `owner`, `admin`), when, and why."""

    model_config = ConfigDict(frozen=True, extra="allow")

    by: str
    at: datetime | None = None
    note: str | None = None


class Evidence(BaseModel):
    """What a late writer or a probe saw, kept for whoever reconciles."""

    model_config = ConfigDict(frozen=True, extra="allow")

    at: datetime | None = None
    source: str | None = None
    detail: str | None = None
    status: int | None = None
    body_sha256: str | None = None


class Operation(BaseModel):
    """The gateway's record of one key in the caller's scope (`GET /operations/<key>`).

    `etag` comes from the lookup's `ETag` header; pass it to `resolve` so a
    concurrent change is refused rather than overwritten.

    >>> op = await client.lookup("run-77:0:c1")
    >>> op.state, op.response.status if op.response else None
    ('completed', 201)
    """

    model_config = ConfigDict(frozen=True, extra="allow")

    id: str
    key: str
    state: OperationState
    route: str
    method: str
    path: str
    fingerprint: str
    attempts: int
    created_at: datetime
    updated_at: datetime
    expires_at: datetime | None = None
    forgotten_at: datetime | None = None
    response: StoredResponse | None = None
    result: Any = None
    """An MCP operation's receipt (method `tools/call`, path the tool name): the tool
    result the server answered, shown here instead of `response`; None when it is gone."""
    error: Any = None
    """An MCP operation whose server answered a JSON-RPC error: that error (`code`,
    `message`, `data`), its receipt."""
    resolution: Resolution | None = None
    evidence: list[Evidence] = Field(default_factory=list)
    safe_to_retry: bool
    etag: str | None = Field(default=None, exclude=True)

    @property
    def has_receipt(self) -> bool:
        """Completed with its response (an MCP result or error) still stored: the result
        can be taken from here."""
        stored = self.response is not None or self.result is not None or self.error is not None
        return self.state == "completed" and stored


@dataclass(frozen=True)
class SimilarTwin:
    """The other key's operation that a `similar-operation` refusal names (its `similar_operation`).

    The gateway refuses a new key whose request is the same as an operation it
    already has under another key: most likely the caller lost the key of its
    first attempt. That operation is the one to settle or to take over; the
    refused key stays bound to it for the route's `similar_window`.

    `state` is the twin's (`in_flight`, `unknown`, `completed`, `released`),
    kept as sent; `operation` its lookup path, `/operations/<percent-encoded key>`.
    """

    key: str
    state: str
    operation: str
    operation_id: str | None = None

    @classmethod
    def from_document(cls, document: object) -> SimilarTwin | None:
        """The twin a problem's `similar_operation` member names; None when it names none."""
        if not isinstance(document, dict):
            return None
        key, state, operation = (document.get(name) for name in ("key", "state", "operation"))
        if not (isinstance(key, str) and isinstance(state, str) and isinstance(operation, str)):
            return None
        operation_id = document.get("operation_id")
        return cls(key, state, operation, operation_id if isinstance(operation_id, str) else None)


@dataclass(frozen=True)
class Response:
    """One answer through the gateway that is not a gateway problem.

    `replayed` is true when the gateway answered from its stored receipt and
    the upstream was not called; `state` is the key's `Idempotency-Status`.
    `headers` look names up case-insensitively.

    >>> response = await client.request("POST", "/tickets/v1/issues", key=k, json={"title": "x"})
    >>> response.status, response.replayed, response.json()["id"]
    (201, False, 'T-1')
    """

    status: int
    headers: Mapping[str, str]
    body: bytes
    key: str | None
    state: str | None
    replayed: bool

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    @property
    def similar(self) -> str | None:
        """The lookup URL of a completed operation of the same request under another key
        (`Idempotency-Similar`), when the gateway noted one: this answer may be a second
        effect of what that operation already did. None when it noted none."""
        return self.headers.get("Idempotency-Similar")

    @property
    def receipt_source(self) -> str | None:
        """Who made a replayed receipt (`Idempotency-Receipt-Source`): `upstream` (the tool's
        own answer), `probe` or `operator`. A probe's or an operator's receipt has their
        status, not the tool's: a probe's lookup answers 200 where the tool's create
        answered 201, so read `status` with it. None for a live answer."""
        return self.headers.get("Idempotency-Receipt-Source")

    def json(self) -> Any:
        """The body parsed as JSON."""
        return jsonlib.loads(self.body)

    def __repr__(self) -> str:
        return (
            f"<Response {self.status} key={self.key!r} state={self.state!r} "
            f"replayed={self.replayed} {len(self.body)} bytes>"
        )
