"""The vocabulary every settings model shares: value types, validators, error locations.

Sections, routes and the top-level settings all check header names, HTTP
methods, durations and sizes the same way, and report problems at a dotted key
(`routes[0].timeout`) that the loader shows to operators and the renderer masks
the same way. Keeping these at the bottom of the config package, importing no
model, is what lets the models, the loader and the renderer import each other
in one direction only.
"""

from __future__ import annotations

import json
import os
import re
from typing import TYPE_CHECKING, Annotated, Literal, TypeVar

from pydantic import AfterValidator, BeforeValidator, ConfigDict, Field, ValidationInfo

from gateway.config.units import parse_duration, parse_size

if TYPE_CHECKING:
    from collections.abc import Mapping

Duration = Annotated[float, BeforeValidator(parse_duration)]
"""Seconds, written as `500ms`, `30s`, `5m`, `24h`, `30d` or a plain number."""
Size = Annotated[int, BeforeValidator(parse_size)]
"""Bytes, written as `512B`, `64KiB`, `1MiB`, `1GiB` or a plain integer."""

_SETTINGS_MODEL = ConfigDict(frozen=True, extra="forbid")
_TOKEN_RE = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # RFC 9110 token
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_ENV_REF_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_PLACEHOLDER_RE = re.compile(r"\{([^{}]*)\}")
_BARE_KEY_RE = re.compile(r"[A-Za-z0-9_-]+")

# Headers the forwarder owns; a static value from the config would break it.
_RESERVED_UPSTREAM_HEADERS = {
    "connection": "hop-by-hop: the forwarder manages its connections",
    "keep-alive": "hop-by-hop: the forwarder manages its connections",
    "te": "hop-by-hop",
    "trailer": "hop-by-hop",
    "upgrade": "hop-by-hop: the gateway never upgrades a connection",
    "transfer-encoding": "message framing is the forwarder's",
    "content-length": "message framing is the forwarder's",
    "idempotency-key": "set per request by `forward_key`; a fixed key would merge every request",
}

# Values that may hold credentials: masked in error messages and render_effective.
_SECRET_KEYS = frozenset({"token", "upstream_headers", "headers", "encryption_keys"})

_Loc = tuple[str | int, ...]
_T = TypeVar("_T")


class _Problems(ValueError):
    """Errors found by a validator, each at a location below the validated value.

    Pydantic keeps the raised exception in the error's context, so
    `_describe` can report each problem at its exact dotted key.
    """

    def __init__(self, *problems: tuple[_Loc, str]) -> None:
        super().__init__("; ".join(f"{_dotted(loc)}: {message}" for loc, message in problems))
        self.problems = problems


def _http_token(value: str, what: str) -> str:
    if not _TOKEN_RE.fullmatch(value):
        raise ValueError(f"{value!r} is not a valid {what} (an HTTP token)")
    return value


def _header_name(value: str) -> str:
    return _http_token(value, "header name")


def _method(value: str) -> str:
    return _http_token(value, "HTTP method").upper()


def _name(value: str) -> str:
    if not _NAME_RE.fullmatch(value):
        raise ValueError(
            f"invalid name {value!r}: use up to 64 letters, digits, '_', '.' and '-', "
            "starting with a letter or digit"
        )
    return value


def _sha256_hex(value: str) -> str:
    digest = value.strip().lower()
    if not _SHA256_RE.fullmatch(digest):
        raise ValueError(
            f"{value!r} is not a SHA-256 hex digest (64 hex characters, "
            "e.g. from `printf %s TOKEN | sha256sum`)"
        )
    return digest


def _not_empty(values: tuple[_T, ...], message: str) -> tuple[_T, ...]:
    # A field validator, not Field(min_length=1): that one also fires, misleadingly,
    # when an item was invalid.
    if not values:
        raise ValueError(message)
    return values


def _lower(value: object) -> object:
    return value.lower() if isinstance(value, str) else value


ForwardKey = Literal["operation_id", "scoped", "key", False]


def _forward_key(value: object) -> object:
    # `true` is the older spelling of "key" (forward the caller's key as it
    # came): it gets the same one-scope check.
    if isinstance(value, str) and value.lower() in ("true", "false"):
        value = value.lower() == "true"
    if value is True:
        return "key"
    if value is False or value in ("operation_id", "scoped", "key"):
        return value
    raise ValueError(
        f'invalid forward_key {value!r}: expected "operation_id", "scoped", "key" or false'
    )


HeaderName = Annotated[str, AfterValidator(_header_name)]
HttpMethod = Annotated[str, AfterValidator(_method)]
HttpStatus = Annotated[int, Field(ge=100, le=599)]
Name = Annotated[str, AfterValidator(_name)]


def _expand_env(env: dict[str, str], info: ValidationInfo) -> dict[str, str]:
    """A stdio server's environment table: names as a shell takes them, `${VAR}` in values
    replaced from the gateway's environment."""
    context = info.context
    environ: Mapping[str, str] = (
        context["environ"] if isinstance(context, dict) and "environ" in context else os.environ
    )
    problems: list[tuple[_Loc, str]] = []
    expanded: dict[str, str] = {}
    for name, value in env.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            problems.append(((name,), "not a valid environment variable name"))
        elif missing := [var for var in _ENV_REF_RE.findall(value) if var not in environ]:
            problems.append(((name,), f"environment variable {missing[0]} is not set"))
        elif "\0" in value:
            problems.append(((name,), "the value contains NUL"))
        else:
            expanded[name] = _ENV_REF_RE.sub(lambda match: environ[match[1]], value)
    if problems:
        raise _Problems(*problems)
    return expanded


def _expand_headers(headers: dict[str, str], info: ValidationInfo) -> dict[str, str]:
    """Check header names and values, replacing `${VAR}` from the environment."""
    context = info.context
    environ: Mapping[str, str] = (
        context["environ"] if isinstance(context, dict) and "environ" in context else os.environ
    )
    problems: list[tuple[_Loc, str]] = []
    expanded: dict[str, str] = {}
    seen: dict[str, str] = {}
    for name, value in headers.items():
        lowered = name.lower()
        if not _TOKEN_RE.fullmatch(name):
            problems.append(((name,), "not a valid header name (an HTTP token)"))
        elif lowered in seen:
            problems.append(((name,), f"the header is given twice (also as {seen[lowered]!r})"))
        elif lowered in _RESERVED_UPSTREAM_HEADERS:
            reason = _RESERVED_UPSTREAM_HEADERS[lowered]
            problems.append(((name,), f"the gateway sets this header itself ({reason})"))
        elif missing := [var for var in _ENV_REF_RE.findall(value) if var not in environ]:
            problems.append(((name,), f"environment variable {missing[0]} is not set"))
        else:
            result = _ENV_REF_RE.sub(lambda match: environ[match[1]], value)
            if any(char in result for char in "\r\n\0"):
                problems.append(((name,), "the value contains CR, LF or NUL"))
            expanded[name] = result
        seen.setdefault(lowered, name)
    if problems:
        raise _Problems(*problems)
    return expanded


def _mask_url(url: str) -> str:
    """Hide every password in a URL: in its userinfo (`user:password@host`) and in
    query parameters whose name holds "password" (`?password=`, `?sslpassword=`).

    >>> _mask_url("postgresql://gw:pw@db/x?sslpassword=k&sslmode=require")
    'postgresql://gw:***@db/x?sslpassword=***&sslmode=require'
    """
    masked = re.sub(r"(//[^/@:]*:)[^/@]*@", r"\1***@", url)
    return re.sub(r"([?&][^=&#]*password[^=&#]*=)[^&#]*", r"\1***", masked, flags=re.IGNORECASE)


def _mask_refused_url(url: str) -> str:
    """A URL a refusal names, with nothing that may be a secret: its password, and its
    whole query and fragment (a refused upstream's `?token=...`).

    >>> _mask_refused_url("http://127.0.0.1:9000/v1?token=s3cret#frag")
    'http://127.0.0.1:9000/v1?***'
    """
    masked = _mask_url(url)
    cut = min((i for i in (masked.find("?"), masked.find("#")) if i >= 0), default=-1)
    return masked if cut < 0 else masked[:cut] + "?***"


def _dotted(loc: _Loc) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            text = part if _BARE_KEY_RE.fullmatch(part) else json.dumps(part)
            out += f".{text}" if out else text
    return out
