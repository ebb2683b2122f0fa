"""The gateway's settings: the validated model tree and what each key accepts.

A gateway that starts with a wrong setting loses or duplicates effects
quietly, so every value is checked here, at start, by pydantic validators
that explain what is wrong in terms of the key (`routes[0].timeout`). The
result is a tree of frozen models passed down explicitly; nothing outside the
config modules reads `os.environ` (test-only fault injection comes through
`Settings.testing` like everything else).

This module is the bottom of the config layer: reading the file and the
environment lives in `gateway.config_loader`, display in
`gateway.config_render`. Both import the models from here; `load_settings`
and `render_effective` are re-exported lazily (see `__getattr__`) so that
`from gateway.config import load_settings` keeps working without an import
cycle.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal, Self, TypeVar
from urllib.parse import urlsplit, urlunsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gateway.scopes import ANONYMOUS_SCOPE
from gateway.units import format_duration, parse_duration, parse_size

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

    from gateway.config_loader import load_settings
    from gateway.config_render import render_effective

__all__ = [
    "CONFIG_ENV_VAR",
    "DEFAULT_CONFIG_PATH",
    "ENV_PREFIX",
    "GATEWAY_PATHS",
    "AdminSettings",
    "ClientSettings",
    "Duration",
    "IdempotencySettings",
    "LoggingSettings",
    "ProbeSettings",
    "RouteSettings",
    "ServerSettings",
    "Settings",
    "Size",
    "StoreSettings",
    "TestingSettings",
    "load_settings",
    "render_effective",
]

ENV_PREFIX = "IDEMPOTENCY_GATEWAY_"
CONFIG_ENV_VAR = "IDEMPOTENCY_GATEWAY_CONFIG"
DEFAULT_CONFIG_PATH = Path("config/gateway.toml")

GATEWAY_PATHS: tuple[str, ...] = (
    "/operations",
    "/admin",
    "/healthz",
    "/readyz",
    "/metrics",
    "/openapi.json",
)
"""The gateway's own paths; no route prefix may equal or nest with one of them."""

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


class ServerSettings(BaseModel):
    """Where the gateway listens.

    >>> ServerSettings(port=9999)
    ServerSettings(host='127.0.0.1', port=9999)
    """

    model_config = _SETTINGS_MODEL

    host: str = Field(default="127.0.0.1", min_length=1)
    port: int = Field(default=8080, ge=0, le=65535)
    client_timeout: Duration = Field(default=30.0, gt=0)
    """How long a caller may take to send a request body (slow senders get 408)."""
    max_header_size: Size = Field(default=8 * 1024, ge=1024)
    """Longest request line or header field accepted (larger: 400 from the parser)."""
    max_headers: int = Field(default=100, ge=8)


class StoreSettings(BaseModel):
    """Where operations are recorded: an SQLite file or a PostgreSQL database.

    `sqlite:///relative/path.db` is relative to the current directory,
    `sqlite:////absolute/path.db` is absolute.

    >>> StoreSettings(url="sqlite:////var/lib/gateway.db").sqlite_path
    PosixPath('/var/lib/gateway.db')
    >>> StoreSettings(url="postgresql://gw@db:5432/gw").is_postgres
    True
    """

    model_config = _SETTINGS_MODEL

    url: str = "sqlite:///./data/gateway.db"
    pool_size: int = Field(default=10, ge=1)
    busy_timeout: Duration = Field(default=5.0, ge=0)
    encryption_keys: tuple[SecretStr, ...] = ()
    """Base64 AES-256 keys for stored bodies; the first encrypts, all decrypt (rotation)."""

    @field_validator("encryption_keys")
    @classmethod
    def _check_keys(cls, keys: tuple[SecretStr, ...]) -> tuple[SecretStr, ...]:
        for index, key in enumerate(keys):
            try:
                raw = base64.b64decode(key.get_secret_value(), validate=True)
            except (binascii.Error, ValueError):
                raw = b""
            if len(raw) != 32:
                raise ValueError(
                    f"key {index} must be 32 random bytes in base64 "
                    "(make one: python -c 'import os,base64;"
                    "print(base64.b64encode(os.urandom(32)).decode())')"
                )
        return keys

    @field_validator("url")
    @classmethod
    def _check_url(cls, url: str) -> str:
        if url.startswith("sqlite:///"):
            if url == "sqlite:///" or "?" in url or "#" in url:
                raise ValueError(
                    "a SQLite URL is sqlite:///relative/path.db or sqlite:////absolute/path.db"
                )
            return url
        if url.startswith(("postgresql://", "postgres://")):
            return url
        raise ValueError(
            "unsupported store URL: expected sqlite:///relative/path.db, "
            "sqlite:////absolute/path.db or postgresql://user@host:5432/db"
        )

    @property
    def is_postgres(self) -> bool:
        return self.url.startswith(("postgresql://", "postgres://"))

    @property
    def sqlite_path(self) -> Path | None:
        """The database file for a SQLite URL, None for PostgreSQL."""
        if self.is_postgres:
            return None
        return Path(self.url.removeprefix("sqlite:///"))


class IdempotencySettings(BaseModel):
    """Scopes, leases and how long receipts and used keys are remembered.

    >>> IdempotencySettings(retention="1h").retention
    3600.0
    """

    model_config = _SETTINGS_MODEL

    scope_headers: tuple[HeaderName, ...] = ("Authorization",)
    shared_scope: bool = False
    """Callers without any `scope_headers` share one scope (or, with `scope_headers = []`,
    everyone does). Off: such a request is 401 `missing-credentials`."""
    retention: Duration = Field(default=24 * 3600.0, gt=0)
    tombstone_retention: Duration = Field(default=30 * 24 * 3600.0, gt=0)
    lease: Duration = Field(default=30.0, gt=0)
    max_wait: Duration = 30.0
    sweep_interval: Duration = Field(default=60.0, gt=0)

    @model_validator(mode="after")
    def _check_shared_scope(self) -> Self:
        if not self.scope_headers and not self.shared_scope:
            raise _Problems(
                (
                    ("scope_headers",),
                    "is empty, which puts every caller in one scope (each can read and "
                    "replay the others' receipts); set shared_scope = true to mean it",
                )
            )
        return self

    @model_validator(mode="after")
    def _check_retentions(self) -> Self:
        # A key forgotten before its receipt would be run again, not refused.
        if self.tombstone_retention < self.retention:
            raise _Problems(
                (
                    ("tombstone_retention",),
                    f"must be at least retention ({format_duration(self.retention)}), "
                    f"got {format_duration(self.tombstone_retention)}",
                )
            )
        return self


class QuotaSettings(BaseModel):
    """Per-scope limits, so one agent cannot starve the others or fill the disk; 0 = none.

    >>> QuotaSettings(new_keys_per_minute=600).new_keys_per_minute
    600
    """

    model_config = _SETTINGS_MODEL

    max_in_flight: int = Field(default=0, ge=0)
    """Protected requests of one scope in flight at once (this process)."""
    new_keys_per_minute: int = Field(default=0, ge=0)
    """New keys one scope may start per minute (this process)."""
    max_operations: int = Field(default=0, ge=0)
    """Records (receipts and tombstones) one scope may keep in the store."""
    route_new_keys_per_minute: int = Field(default=0, ge=0)
    """New keys all scopes together may start on one route per minute (this process):
    the cap that a fresh credential per request cannot escape."""


MIN_ADMIN_TOKEN_LENGTH = 24
"""The admin API reads and settles every scope's operations: no guessable token."""

_PLACEHOLDER_TOKENS = frozenset(
    {"change-me", "changeme", "change_me", "admin", "secret", "password", "token",
     "default", "example", "test", "changeit", "letmein", "replace-me"}
)  # fmt: skip
"""Tokens copied from examples rather than generated (compared case-insensitively)."""


class AdminSettings(BaseModel):
    """The operators' API; disabled (404) while the token is empty.

    With a token, the admin endpoints are served only on their own listener,
    `host`:`port` (loopback by default), never on the main one: the main
    listener answers 404 for `/admin`. `listen = "HOST:PORT"` is the older
    spelling of the two keys.

    >>> AdminSettings().enabled, AdminSettings(token="Zq4-7hL2pW9xR1vT8mK3nB6c").enabled
    (False, True)
    >>> AdminSettings(listen="127.0.0.1:9090").port
    9090
    """

    model_config = _SETTINGS_MODEL

    token: SecretStr = SecretStr("")
    host: str = "127.0.0.1"
    port: int = Field(default=8081, ge=0, le=65535)

    @model_validator(mode="before")
    @classmethod
    def _older_listen(cls, data: object) -> object:
        if not isinstance(data, dict) or "listen" not in data:
            return data
        data = dict(data)
        listen = data.pop("listen")
        if "host" in data or "port" in data:
            raise _Problems((("listen",), "give host and port, or listen, not both"))
        host, _, port = str(listen).rpartition(":")
        if not host or not port.isdigit() or int(port) > 65535:
            raise _Problems((("listen",), f"expected HOST:PORT, got {listen!r}"))
        return {**data, "host": host.strip("[]"), "port": int(port)}

    @field_validator("token")
    @classmethod
    def _check_token(cls, token: SecretStr) -> SecretStr:
        value = token.get_secret_value()
        if not value:
            return token  # the admin endpoints are disabled
        if not re.fullmatch(r"[\x21-\x7e]+", value):
            raise ValueError("must be printable ASCII without spaces (it is a Bearer token)")
        if value.lower() in _PLACEHOLDER_TOKENS:
            raise ValueError(
                "is a well-known placeholder: generate one, e.g. `openssl rand -base64 32`"
            )
        if len(value) < MIN_ADMIN_TOKEN_LENGTH:
            raise ValueError(
                f"is {len(value)} characters long; an admin token needs at least "
                f"{MIN_ADMIN_TOKEN_LENGTH} (e.g. `openssl rand -base64 32`)"
            )
        return token

    @property
    def enabled(self) -> bool:
        return bool(self.token.get_secret_value())


class ClientSettings(BaseModel):
    """A caller with gateway-issued tokens; its name is its scope.

    Several digests let a client rotate tokens without changing scope.

    >>> ClientSettings(name="agent-a", token_sha256=["AB" * 32]).token_sha256[0][:4]
    'abab'
    """

    model_config = _SETTINGS_MODEL

    name: Name
    token_sha256: tuple[Annotated[str, AfterValidator(_sha256_hex)], ...]

    @field_validator("token_sha256")
    @classmethod
    def _check_not_empty(cls, digests: tuple[str, ...]) -> tuple[str, ...]:
        return _not_empty(digests, "a client needs at least one token digest")


class ProbeSettings(BaseModel):
    """How to ask an upstream whether an `unknown` effect exists.

    `{forwarded_key}` in `path` is replaced (URL-encoded) by what the route
    forwarded for the operation; `{key}` and `{operation_id}` are accepted where
    they equal it. The route checks that the path names what it forwards.

    >>> ProbeSettings(path="/v1/issues?client_ref={forwarded_key}").not_applied_after
    300.0
    """

    model_config = _SETTINGS_MODEL

    method: HttpMethod = "GET"
    path: str
    applied_statuses: tuple[HttpStatus, ...] = (200,)
    not_applied_statuses: tuple[HttpStatus, ...] = (404,)
    not_applied_after: Duration = 300.0
    headers: dict[str, str] = Field(default_factory=dict)

    @field_validator("applied_statuses")
    @classmethod
    def _check_applied(cls, statuses: tuple[int, ...]) -> tuple[int, ...]:
        return _not_empty(statuses, "a probe needs at least one status that means applied")

    @field_validator("path")
    @classmethod
    def _check_path(cls, path: str) -> str:
        if not path.startswith("/"):
            raise ValueError(f"must start with '/', got {path!r}")
        if any(not "!" <= char <= "~" for char in path):
            raise ValueError("must not contain spaces, control or non-ASCII characters")
        unknown = set(_PLACEHOLDER_RE.findall(path)) - {"key", "operation_id", "forwarded_key"}
        if unknown:
            raise ValueError(
                f"unknown placeholder {{{sorted(unknown)[0]}}}: "
                "only {key}, {operation_id} and {forwarded_key}"
            )
        return path

    @field_validator("headers")
    @classmethod
    def _check_headers(cls, headers: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        return _expand_headers(headers, info)

    @model_validator(mode="after")
    def _check_statuses(self) -> Self:
        both = sorted(set(self.applied_statuses) & set(self.not_applied_statuses))
        if both:
            raise _Problems(
                (("not_applied_statuses",), f"{both} also in applied_statuses; a status means one")
            )
        return self


class RouteSettings(BaseModel):
    """A path prefix mapped to one upstream, and how its calls are protected.

    >>> route = RouteSettings(name="tickets", prefix="/tickets/", upstream="http://127.0.0.1:9000/")
    >>> route.prefix, route.upstream, route.methods, route.redact_response_headers
    ('/tickets', 'http://127.0.0.1:9000', ('POST', 'PATCH'), ('set-cookie',))
    """

    model_config = _SETTINGS_MODEL

    name: Name
    prefix: str
    upstream: str
    methods: tuple[HttpMethod, ...] = ("POST", "PATCH")
    require_key: bool = True
    timeout: Duration = Field(default=30.0, gt=0)
    keepalive: Duration = 4.0
    max_body: Size = 1 << 20
    max_stored_response: Size = 1 << 20
    max_concurrency: int = Field(default=256, ge=1)
    forward_key: Annotated[ForwardKey, BeforeValidator(_forward_key)] = "operation_id"
    clients: tuple[Name, ...] | None = None
    """Only these `[[clients]]` may use the route (others: 403); None: every caller."""
    # Only refusals: a 2xx or 3xx may mean the effect happened.
    release_statuses: tuple[Annotated[int, Field(ge=400, le=599)], ...] = (429,)
    redact_response_headers: tuple[HeaderName, ...] = ("set-cookie",)
    tls_ca: Path | None = None
    tls_client_cert: Path | None = None
    tls_client_key: Path | None = None
    upstream_headers: dict[str, str] = Field(default_factory=dict)
    probe: ProbeSettings | None = None

    @field_validator("prefix")
    @classmethod
    def _check_prefix(cls, prefix: str) -> str:
        if not prefix.startswith("/"):
            raise ValueError(f"must start with '/', got {prefix!r}")
        stripped = prefix.rstrip("/")
        if not stripped:
            raise ValueError("'/' would capture every path; use a prefix such as '/tickets'")
        if any(char in "?#" or not "!" <= char <= "~" for char in stripped):
            raise ValueError("must be a plain path: no '?', '#', spaces or non-ASCII")
        return stripped

    @field_validator("upstream")
    @classmethod
    def _check_upstream(cls, upstream: str) -> str:
        try:
            parts = urlsplit(upstream)
            parts.port  # noqa: B018 (urlsplit checks the port only when asked)
        except ValueError as exc:
            raise ValueError(f"not a valid URL: {exc}") from exc
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL with a host")
        if "@" in parts.netloc:
            raise ValueError("must not hold credentials; put them in upstream_headers")
        if "?" in upstream or "#" in upstream:
            raise ValueError("must not have a query or fragment")
        return urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))

    @field_validator("methods")
    @classmethod
    def _dedupe_methods(cls, methods: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(dict.fromkeys(methods))

    @field_validator("redact_response_headers")
    @classmethod
    def _redact_cookies(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        # Set-Cookie is a credential meant for one client: never stored or replayed.
        return tuple(dict.fromkeys(("set-cookie", *(name.lower() for name in names))))

    @field_validator("upstream_headers")
    @classmethod
    def _check_headers(cls, headers: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        return _expand_headers(headers, info)

    @model_validator(mode="after")
    def _check_combinations(self) -> Self:
        problems: list[tuple[_Loc, str]] = []
        if self.tls_client_key is not None and self.tls_client_cert is None:
            problems.append((("tls_client_key",), "needs tls_client_cert"))
        if not self.upstream.startswith("https://"):
            for name in ("tls_ca", "tls_client_cert", "tls_client_key"):
                if getattr(self, name) is not None:
                    problems.append(((name,), "only applies to an https:// upstream"))
        if (probe_problem := self._probe_path_problem()) is not None:
            problems.append((("probe", "path"), probe_problem))
        if problems:
            raise _Problems(*problems)
        return self

    def _probe_path_problem(self) -> str | None:
        """Why the probe path cannot name the effect the upstream saw, if it cannot.

        A probe finds an effect by what this route forwarded. Asked about
        anything else, the upstream answers "not applied" for an effect that
        exists, the key is released, and the retry is a second effect.
        """
        if self.probe is None:
            return None
        route = f'route "{self.name}"'
        named = set(_PLACEHOLDER_RE.findall(self.probe.path))
        mode = self.forward_key
        if mode is False:
            return (
                f"{route} has forward_key = false: the upstream never sees the key nor the "
                "operation id, so no probe can name the effect; forward one, or remove the probe"
            )
        if "operation_id" in named and mode != "operation_id":
            return (
                f'{{operation_id}} needs forward_key = "operation_id": {route} forwards '
                f"{_FORWARDED[mode]}, so the upstream never sees the operation id "
                "(use {forwarded_key})"
            )
        if "key" in named and mode != "key":
            return (
                f'{{key}} needs forward_key = "key": {route} forwards {_FORWARDED[mode]}, '
                "so the upstream never sees the caller's key (use {forwarded_key})"
            )
        if not named & {"key", "operation_id", "forwarded_key"}:
            return (
                f"names no effect: {route}'s probe would ask the same question for every "
                "operation; put {forwarded_key} (what the route forwards) in the path"
            )
        return None


_FORWARDED = {
    "operation_id": "the operation id",
    "scoped": "the scoped key (<scope label>:<key>)",
    "key": "the caller's key",
}


class LoggingSettings(BaseModel):
    """Log verbosity and format (JSON lines for machines, text for people).

    >>> LoggingSettings(level="DEBUG").level
    'debug'
    """

    model_config = _SETTINGS_MODEL

    level: Annotated[Literal["debug", "info", "warning", "error"], BeforeValidator(_lower)] = "info"
    format: Annotated[Literal["json", "text"], BeforeValidator(_lower)] = "json"


class TestingSettings(BaseModel):
    """Test-only fault injection (e.g. `crash_after_claim`); production never sets it.

    Only the environment (`IDEMPOTENCY_GATEWAY_TESTING__FAULT`) or `overrides`
    can set it: a config file with a `[testing]` section is refused, so a
    copied test config cannot arm a fault in production.

    >>> TestingSettings().fault is None
    True
    """

    __test__ = False  # not a pytest test class despite its name
    model_config = _SETTINGS_MODEL

    fault: str | None = None


class Settings(BaseModel):
    """The whole, validated configuration.

    >>> settings = Settings()
    >>> settings.server.port, settings.routes, settings.admin.enabled
    (8080, (), False)
    """

    model_config = _SETTINGS_MODEL

    server: ServerSettings = Field(default_factory=ServerSettings)
    store: StoreSettings = Field(default_factory=StoreSettings)
    idempotency: IdempotencySettings = Field(default_factory=IdempotencySettings)
    admin: AdminSettings = Field(default_factory=AdminSettings)
    quotas: QuotaSettings = Field(default_factory=QuotaSettings)
    clients: tuple[ClientSettings, ...] = ()
    routes: tuple[RouteSettings, ...] = ()
    logging: LoggingSettings = Field(default_factory=LoggingSettings)
    testing: TestingSettings = Field(default_factory=TestingSettings)

    @model_validator(mode="after")
    def _check_across(self) -> Self:
        problems = [
            *self._client_problems(),
            *self._route_problems(),
            *self._route_client_problems(),
            *self._bare_key_problems(),
            *self._listener_problems(),
        ]
        if problems:
            raise _Problems(*problems)
        return self

    def _listener_problems(self) -> Iterator[tuple[_Loc, str]]:
        port = self.admin.port
        if self.admin.enabled and port != 0 and port == self.server.port:
            yield (
                ("admin", "port"),
                f"is the main listener's port {port}; the admin API needs a port of its "
                "own, so that no path to it runs through the main listener",
            )

    def _client_problems(self) -> Iterator[tuple[_Loc, str]]:
        names: dict[str, int] = {}
        owners: dict[str, int] = {}
        for i, client in enumerate(self.clients):
            if client.name in names:
                yield (
                    ("clients", i, "name"),
                    f"duplicate client name {client.name!r} (also clients[{names[client.name]}])",
                )
            names.setdefault(client.name, i)
            for j, digest in enumerate(client.token_sha256):
                owner = owners.setdefault(digest, i)
                if owner != i:
                    yield (
                        ("clients", i, "token_sha256", j),
                        (
                            f"this digest also belongs to clients[{owner}]; "
                            "a token must identify one client"
                        ),
                    )

    def _route_problems(self) -> Iterator[tuple[_Loc, str]]:
        names: dict[str, int] = {}
        prefixes: dict[str, int] = {}
        for i, route in enumerate(self.routes):
            if route.name in names:
                yield (
                    ("routes", i, "name"),
                    f"duplicate route name {route.name!r} (also routes[{names[route.name]}])",
                )
            if route.prefix in prefixes:
                yield (
                    ("routes", i, "prefix"),
                    f"duplicate prefix {route.prefix!r} (also routes[{prefixes[route.prefix]}])",
                )
            names.setdefault(route.name, i)
            prefixes.setdefault(route.prefix, i)
            for own in GATEWAY_PATHS:
                if _paths_overlap(route.prefix, own):
                    yield (
                        ("routes", i, "prefix"),
                        f"{route.prefix!r} overlaps the gateway's own path {own!r}",
                    )

    def _route_client_problems(self) -> Iterator[tuple[_Loc, str]]:
        known = {client.name for client in self.clients}
        for i, route in enumerate(self.routes):
            if route.clients is None:
                continue
            if not self.clients:
                yield (
                    ("routes", i, "clients"),
                    "names clients, but no [[clients]] are configured: without them the "
                    "gateway cannot tell callers apart by name",
                )
                continue
            if not route.clients:
                yield (("routes", i, "clients"), "is empty: no client could use the route")
            for j, name in enumerate(route.clients):
                if name not in known:
                    yield (("routes", i, "clients", j), f"no [[clients]] entry is named {name!r}")

    def _bare_key_problems(self) -> Iterator[tuple[_Loc, str]]:
        """`forward_key = "key"` sends the caller's key as it came: two scopes that
        both use `order-7` would be one effect to an upstream that dedupes or is
        probed. Allowed only where one scope reaches every route to that origin."""
        for i, route in enumerate(self.routes):
            if route.forward_key != "key":
                continue
            origin = _origin(route.upstream)
            siblings = [other for other in self.routes if _origin(other.upstream) == origin]
            reach = {self._scopes_reaching(other) for other in siblings}
            only = next(iter(reach)) if len(reach) == 1 else None
            if only is not None and len(only) == 1:
                continue
            yield (
                ("routes", i, "forward_key"),
                f'"key" forwards the caller\'s key as it came, so two callers using one key '
                f"would be one effect to {origin}; allowed only where a single client reaches "
                "every route to that upstream (one [[clients]] entry, or route clients = "
                '["<name>"] on each), else use "operation_id" or "scoped"',
            )

    def _scopes_reaching(self, route: RouteSettings) -> frozenset[str]:
        """The scopes that can use a route; an open set (HMAC scopes) as the empty set."""
        if self.clients:
            names = route.clients if route.clients is not None else self.clients_names
            return frozenset(names)
        if not self.idempotency.scope_headers:
            return frozenset({ANONYMOUS_SCOPE})  # shared_scope: everyone is one scope
        return frozenset()

    @property
    def clients_names(self) -> tuple[str, ...]:
        return tuple(client.name for client in self.clients)


def _origin(url: str) -> str:
    """`scheme://host:port`, the port made explicit: one upstream, however spelled."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.scheme}://{(parts.hostname or '').lower()}:{port}"


def _paths_overlap(a: str, b: str) -> bool:
    """Equal, or one is a whole-segment prefix of the other (`/metrics/x`, not `/metricsx`)."""
    return a == b or a.startswith(b + "/") or b.startswith(a + "/")


def _mask_url(url: str) -> str:
    """Hide every password in a URL: in its userinfo (`user:password@host`) and in
    query parameters whose name holds "password" (`?password=`, `?sslpassword=`).

    >>> _mask_url("postgresql://gw:pw@db/x?sslpassword=k&sslmode=require")
    'postgresql://gw:***@db/x?sslpassword=***&sslmode=require'
    """
    masked = re.sub(r"(//[^/@:]*:)[^/@]*@", r"\1***@", url)
    return re.sub(r"([?&][^=&#]*password[^=&#]*=)[^&#]*", r"\1***", masked, flags=re.IGNORECASE)


def _dotted(loc: _Loc) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            text = part if _BARE_KEY_RE.fullmatch(part) else json.dumps(part)
            out += f".{text}" if out else text
    return out


def __getattr__(name: str) -> object:
    # The loader and the renderer import the models from here, so importing
    # them at the top would be a cycle; import them on first use instead.
    if name == "load_settings":
        from gateway.config_loader import load_settings

        return load_settings
    if name == "render_effective":
        from gateway.config_render import render_effective

        return render_effective
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
