"""The JSON body of a resolve request, validated at the boundary with pydantic.

Operator text is refused here, with a 400, when a store could not hold it or a
receipt could not be replayed with it: a NUL (PostgreSQL text and jsonb refuse
it, SQLite would take it, so the two stores would differ) or a lone surrogate
(not Unicode text, so not UTF-8 either). A receipt's header values must be
sendable field values: no control characters but tab.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from gateway.engine.errors import InvalidRequest
from gateway.engine.models import Operation, StoredResponse
from gateway.mcp.replies import TOOL_CALL, stored_result
from gateway.upstream.headers import end_to_end

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # RFC 9110 field name
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # not in an RFC 9110 field value


def storable_problem(text: str) -> str | None:
    """What makes `text` unfit to store as text (a NUL, a lone surrogate), or None.

    >>> storable_problem("a\\x00b"), storable_problem("ok")
    ('has a NUL character at position 1', None)
    """
    nul = text.find("\x00")
    if nul >= 0:
        return f"has a NUL character at position {nul}"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"has a lone surrogate at position {exc.start} (not Unicode text)"
    return None


def _storable(text: str) -> str:
    if (problem := storable_problem(text)) is not None:
        raise ValueError(f"the text {problem}, which not every store can hold")
    return text


StorableText = Annotated[str, AfterValidator(_storable)]
"""Text every store holds alike: no NUL, no lone surrogate."""


class ResolveResponse(BaseModel):
    """The response the operator or agent vouches for, stored as the receipt."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    status: int = Field(ge=200, le=599)
    headers: dict[str, str] = Field(default_factory=dict)
    body: str = ""
    body_encoding: Literal["utf-8", "base64"] = "utf-8"

    @field_validator("headers")
    @classmethod
    def _sendable(cls, headers: dict[str, str]) -> dict[str, str]:
        # A receipt is immutable and replayed forever: it must be sendable.
        for name, value in headers.items():
            if not _TOKEN.fullmatch(name):
                raise ValueError(f"header name {name!r} is not an HTTP token")
            if control := _CONTROL.search(value):
                raise ValueError(
                    f"header {name!r} has a control character ({control[0]!r}) in its value; "
                    "only tab is allowed"
                )
            if (problem := storable_problem(value)) is not None:
                raise ValueError(f"header {name!r} {problem}")
        return headers

    @model_validator(mode="after")
    def _text_body(self) -> ResolveResponse:
        if self.body_encoding == "utf-8" and (problem := storable_problem(self.body)) is not None:
            raise ValueError(
                f"the utf-8 body {problem}; send bytes that are not text as base64 "
                '(body_encoding = "base64")'
            )
        return self

    def stored(self) -> StoredResponse:
        if self.body_encoding == "base64":
            try:
                body = base64.b64decode(self.body, validate=True)
            except (binascii.Error, ValueError) as exc:  # ValueError: non-ASCII text
                raise InvalidRequest(f"response.body is not valid base64: {exc}") from exc
        else:
            body = self.body.encode("utf-8")
        headers = end_to_end(self.headers.items(), drop=frozenset({"set-cookie"}))
        return StoredResponse(status=self.status, headers=headers, body=body)


class ResolveBody(BaseModel):
    """`{"outcome": "applied", "response": {...}, "note": ...}` or `{"outcome": "not_applied"}`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    outcome: Literal["applied", "not_applied"]
    response: ResolveResponse | None = None
    result: dict[str, Any] | None = None
    """For an MCP operation: the tool result (`content`, `structuredContent`, `isError`)."""
    note: StorableText | None = Field(default=None, max_length=2000)
    force: bool = False
    """Admin endpoints only: release although the last send may still be applied."""
    share_with_owner: bool = False
    """Admin endpoints only: the operation's owner may read the note."""

    @model_validator(mode="after")
    def _response_only_when_applied(self) -> ResolveBody:
        if self.outcome == "not_applied" and (self.response or self.result) is not None:
            raise ValueError("a not_applied resolution carries no response or result")
        if self.response is not None and self.result is not None:
            raise ValueError("send a response (HTTP operation) or a result (MCP), not both")
        return self

    def receipt_for(self, operation: Operation) -> StoredResponse | None:
        """The receipt to store, in the form the operation's front end replays."""
        return _receipt(operation, self.response, self.result)


class AttachBody(BaseModel):
    """`{"response": {...}, "note": ...}` (or `"result"` for an MCP operation): the receipt
    an `applied` settlement went without, and why it is known now."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    response: ResolveResponse | None = None
    result: dict[str, Any] | None = None
    note: StorableText = Field(min_length=1, max_length=2000)
    share_with_owner: bool = False

    @model_validator(mode="after")
    def _one_receipt(self) -> AttachBody:
        if (self.response is None) == (self.result is None):
            raise ValueError("send the receipt: a response (HTTP operation) or a result (MCP)")
        if not self.note.strip():
            raise ValueError("a note is required: say where the response comes from")
        return self

    def receipt_for(self, operation: Operation) -> StoredResponse:
        receipt = _receipt(operation, self.response, self.result)
        assert receipt is not None  # one of the two is set (`_one_receipt`)
        return receipt


def _receipt(
    operation: Operation, response: ResolveResponse | None, result: dict[str, Any] | None
) -> StoredResponse | None:
    """The receipt to store, in the form the operation's front end replays."""
    if operation.method == TOOL_CALL:
        if response is not None:
            raise InvalidRequest(
                'an MCP operation is resolved with a "result" (the tool result), not a "response"'
            )
        return stored_result(result) if result is not None else None
    if result is not None:
        raise InvalidRequest('an HTTP operation is resolved with a "response", not a "result"')
    return response.stored() if response else None


def parse_resolve_body(raw: bytes) -> ResolveBody:
    """Parse and validate, turning every problem into one `400 invalid-request`."""
    return _parsed(ResolveBody, raw, "resolve")


def parse_attach_body(raw: bytes) -> AttachBody:
    """Parse and validate, turning every problem into one `400 invalid-request`."""
    return _parsed(AttachBody, raw, "attach")


_Model = TypeVar("_Model", bound=BaseModel)


def _parsed(model: type[_Model], raw: bytes, what: str) -> _Model:
    try:
        return model.model_validate_json(raw or b"null")
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc']) or 'body'}: {error['msg']}"
            for error in exc.errors()
        )
        raise InvalidRequest(f"invalid {what} request: {problems}") from exc
