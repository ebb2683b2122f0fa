"""The JSON body of a resolve request, validated at the boundary with pydantic."""

from __future__ import annotations

import base64
import binascii
import re
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from gateway.errors import InvalidRequest
from gateway.headers import end_to_end
from gateway.models import StoredResponse

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # RFC 9110 field name


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
            if any(ch in value for ch in "\r\n\x00"):
                raise ValueError(f"header {name!r} has a CR, LF or NUL in its value")
        return headers

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
    note: str | None = Field(default=None, max_length=2000)

    @model_validator(mode="after")
    def _response_only_when_applied(self) -> ResolveBody:
        if self.outcome == "not_applied" and self.response is not None:
            raise ValueError("a not_applied resolution carries no response")
        return self


def parse_resolve_body(raw: bytes) -> ResolveBody:
    """Parse and validate, turning every problem into one `400 invalid-request`."""
    try:
        return ResolveBody.model_validate_json(raw or b"null")
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc']) or 'body'}: {error['msg']}"
            for error in exc.errors()
        )
        raise InvalidRequest(f"invalid resolve request: {problems}") from exc
