"""What an operator sees of a request: recorded with its operation, secrets taken out.

To settle an `unknown` operation by hand, an operator must know which effect
to look for in the tool (which ticket, which refund): the request says. It
is recorded with the first attempt, erasable and sealed like a receipt, and
capped (`record_request_max`): a larger body keeps its size and digest only.

Values that name secrets (`redact_request`) are replaced before anything is
kept, in every body format the gateway can read: JSON (any JSON media type,
or a body of another type that parses as JSON), form fields
(`application/x-www-form-urlencoded`), multipart fields (by their name), query
parameters, MCP arguments; JSON pointers reach one place. Names match
case-blind, ignoring `_`, `-` and a trailing `[]` (`accessToken` is
`access_token`), and the default names (`DEFAULT_REQUEST_REDACTIONS`) match as
suffixes (`token` covers `refresh_token`). A body redaction cannot read while
names are configured (another content type, JSON that does not parse, bytes
that are not UTF-8) is recorded as its size and digest only
(`body_gone: "unparsed"`), unless the route says `record_raw = true`.

The digest (`digest`) is an HMAC keyed by the scope secret and the scope
(`gateway.engine.digests`), of the body as recorded (after redaction): it
tells two bodies apart and confirms no guess of a redacted value.

>>> record = http_record(method="POST", target="/v1/refunds?api_key=s3cret&x=1",
...     content_type="application/json", body=b'{"amount": 5, "accessToken": "t"}',
...     limit=1024, redact=("api_key", "token"), digest=lambda body: "d")
>>> record["target"], record["body"]
('/v1/refunds?api_key=%5Bredacted%5D&x=1', '{"amount":5,"accessToken":"[redacted]"}')
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import parse_qsl, urlencode

__all__ = [
    "REDACTED",
    "Redactions",
    "http_record",
    "mcp_record",
    "redacted_arguments",
    "redacted_target",
]

REDACTED = "[redacted]"

DEFAULT_NAMES = frozenset(
    {
        "apikey",
        "accesstoken",
        "refreshtoken",
        "token",
        "password",
        "secret",
        "clientsecret",
        "authorization",
    }
)
"""The default `redact_request` names, normalised (`Redactions.normal`): these match as
suffixes of a normalised name. Kept equal to `DEFAULT_REQUEST_REDACTIONS` by a test."""

Digest = Callable[[bytes], str]


class Redactions:
    """The names and pointers of a route's `redact_request`, and how a name matches.

    >>> redactions = Redactions(("token", "card_number", "/payment/cvc"))
    >>> [redactions.hides(n) for n in ("X-Refresh-Token", "cardNumber[]", "card", "tokens")]
    [True, True, False, False]
    """

    def __init__(self, redact: Sequence[str]) -> None:
        names = {self.normal(name) for name in redact if not name.startswith("/")}
        self.suffixes = tuple(names & DEFAULT_NAMES)
        self.exact = frozenset(names - DEFAULT_NAMES)
        self.pointers = tuple(name for name in redact if name.startswith("/"))

    def __bool__(self) -> bool:
        return bool(self.suffixes or self.exact or self.pointers)

    @staticmethod
    def normal(name: str) -> str:
        """A name as names are compared: lower case, no `_` or `-`, no trailing `[]`."""
        return name.removesuffix("[]").lower().replace("_", "").replace("-", "")

    def hides(self, name: str) -> bool:
        normal = self.normal(name)
        return normal in self.exact or normal.endswith(self.suffixes)


def http_record(
    *,
    method: str,
    target: str,
    content_type: str | None,
    body: bytes,
    limit: int,
    redact: Sequence[str],
    digest: Digest,
    record_raw: bool = False,
) -> dict[str, Any] | None:
    """The record of a plain HTTP request, or None when the route records none."""
    if limit <= 0:
        return None
    redactions = Redactions(redact)
    record: dict[str, Any] = {
        "method": method,
        "target": _redacted_target(target, redactions),
        "content_type": content_type,
        "size": len(body),
    }
    if len(body) > limit:
        return {**record, "digest": digest(body), "body": None, "body_gone": "too_large"}
    kept = _redacted_body(content_type, body, redactions)
    if kept is None and redactions and not record_raw:
        return {**record, "digest": digest(body), "body": None, "body_gone": "unparsed"}
    if kept is None:
        try:
            kept = body.decode()
        except UnicodeDecodeError:
            raw = base64.b64encode(body).decode()
            return {**record, "digest": digest(body), "body": raw, "body_encoding": "base64"}
    return {**record, "digest": digest(kept.encode()), "body": kept, "body_encoding": "utf-8"}


def mcp_record(
    *, tool: str, arguments: Any, size: int, limit: int, redact: Sequence[str]
) -> dict[str, Any] | None:
    """The record of an MCP tool call: the tool and its arguments."""
    if limit <= 0:
        return None
    record: dict[str, Any] = {"method": "tools/call", "tool": tool, "size": size}
    if size > limit:
        return {**record, "arguments": None, "body_gone": "too_large"}
    try:
        return {**record, "arguments": _redact_value(arguments, Redactions(redact), "")}
    except RecursionError:  # nested deeper than anyone reads: size and name only
        return {**record, "arguments": None, "body_gone": "too_large"}


def redacted_target(target: str, redact: Sequence[str]) -> str:
    """A path and query with the values of `redact`'s query names replaced (a probe's
    request as the history shows it)."""
    return _redacted_target(target, Redactions(redact))


def redacted_arguments(arguments: Any, redact: Sequence[str]) -> Any:
    """Tool arguments with `redact`'s member names and pointers replaced."""
    return _redact_value(arguments, Redactions(redact), "")


def _media(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()


def _redacted_body(content_type: str | None, body: bytes, redactions: Redactions) -> str | None:
    """The body as text with secret values replaced; None when redaction cannot read it
    (or there is nothing to redact: then it is recorded as sent, unparsed)."""
    if not body:
        return ""
    if not redactions:
        return None
    media = _media(content_type)
    if media == "application/x-www-form-urlencoded":
        return _redacted_form(body, redactions)
    if media == "multipart/form-data":
        return _redacted_multipart(content_type or "", body, redactions)
    return _redacted_json(body, redactions)  # any type: a body that parses as JSON is JSON


def _redacted_target(target: str, redactions: Redactions) -> str:
    path, separator, query = target.partition("?")
    if not separator or not redactions:
        return target
    pairs = parse_qsl(query, keep_blank_values=True)
    if not any(redactions.hides(name) for name, _ in pairs):
        return target
    return path + "?" + urlencode([(n, REDACTED if redactions.hides(n) else v) for n, v in pairs])


def _redacted_form(body: bytes, redactions: Redactions) -> str | None:
    try:
        text = body.decode("ascii")
        pairs = parse_qsl(text, keep_blank_values=True, strict_parsing=True, errors="strict")
    except (UnicodeDecodeError, ValueError):
        return None
    if not any(redactions.hides(name) for name, _ in pairs):
        return text
    return urlencode([(n, REDACTED if redactions.hides(n) else v) for n, v in pairs])


_NAME = re.compile(rb'(?i)content-disposition:[^\r\n]*?\bname="([^"]*)"')


def _redacted_multipart(content_type: str, body: bytes, redactions: Redactions) -> str | None:
    """The parts as sent, each named part's content replaced when its name is a secret;
    None when the body is not the multipart its boundary announces, or not UTF-8."""
    boundary = next(
        (
            value.strip().strip('"')
            for name, _, value in (p.partition("=") for p in content_type.split(";")[1:])
            if name.strip().lower() == "boundary"
        ),
        "",
    )
    delimiter = b"--" + boundary.encode("latin-1")
    if not boundary or not body.startswith(delimiter):
        return None
    pieces = body.split(delimiter)
    if not pieces[-1].startswith(b"--"):
        return None
    kept = [pieces[0]]
    for piece in pieces[1:-1]:
        head, separator, content = piece.partition(b"\r\n\r\n")
        if not separator:
            return None
        named = _NAME.search(head)
        if named is not None and redactions.hides(named.group(1).decode("latin-1")):
            content = REDACTED.encode() + b"\r\n"
        kept.append(head + separator + content)
    kept.append(pieces[-1])
    try:
        return delimiter.join(kept).decode()
    except UnicodeDecodeError:
        return None


def _redacted_json(body: bytes, redactions: Redactions) -> str | None:
    """The body with secret values replaced, or None when it is not JSON."""
    try:
        document = json.loads(body)
        redacted = _redact_value(document, redactions, "")
    except (ValueError, RecursionError):
        return None
    if redacted == document:
        return body.decode("utf-8", errors="replace")
    return json.dumps(redacted, separators=(",", ":"), ensure_ascii=False)


def _redact_value(value: Any, redactions: Redactions, at: str) -> Any:
    if at and at in redactions.pointers:
        return REDACTED
    if isinstance(value, dict):
        return {
            key: REDACTED
            if redactions.hides(str(key))
            else _redact_value(item, redactions, f"{at}/{_escape(str(key))}")
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [_redact_value(item, redactions, f"{at}/{i}") for i, item in enumerate(value)]
    return value


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")
