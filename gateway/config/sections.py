"""The settings sections that stand alone: listener, store, keys, admin, quotas, clients, logs.

Each section is checked on its own here (a port range, a store URL, an admin
token that is not a placeholder); what needs several sections at once (a
route's clients, the admin port against the main one) is checked by
`gateway.config.settings`.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import os
import re
from pathlib import Path
from typing import Annotated, Literal, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    Field,
    IPvAnyNetwork,
    SecretStr,
    field_validator,
    model_validator,
)

from gateway.config.fields import (
    _SETTINGS_MODEL,
    Duration,
    HeaderName,
    Name,
    Size,
    _lower,
    _not_empty,
    _Problems,
    _sha256_hex,
)
from gateway.config.units import format_duration


def _worker_count(value: object) -> object:
    """`"auto"` is one worker per core this process may run on."""
    if value == "auto":
        return len(os.sched_getaffinity(0)) or 1
    if isinstance(value, str) and not value.strip().isdigit():
        raise ValueError('expected a number of processes (1 or more) or "auto"')
    return value


class ServerSettings(BaseModel):
    """Where the gateway listens.

    >>> server = ServerSettings(port=9999)
    >>> server.host, server.port
    ('127.0.0.1', 9999)
    """

    model_config = _SETTINGS_MODEL

    host: str = Field(default="127.0.0.1", min_length=1)
    port: int = Field(default=8080, ge=0, le=65535)
    client_timeout: Duration = Field(default=30.0, gt=0)
    """How long a caller may take to send a request body (slow senders get 408)."""
    max_header_size: Size = Field(default=8 * 1024, ge=1024)
    """Longest request line or header field accepted (larger: 400 from the parser)."""
    max_headers: int = Field(default=100, ge=8)
    loop: Literal["uvloop", "asyncio"] = "uvloop"
    """The event loop: uvloop (installed with the gateway on Linux and macOS; asyncio's own
    where it is missing), or asyncio's own on purpose."""
    workers: Annotated[int, BeforeValidator(_worker_count)] = Field(default=1, ge=1, le=256)
    """Serving processes on the one port: 1 (the default) serves in this process;
    more run under a supervisor (`gateway.workers`); "auto" is one per core."""
    write_timeout: Duration = Field(default=30.0, gt=0)
    """How long one write to a caller may wait for the caller to read: a caller that
    stops reading is cut after it (its operation's outcome is already decided)."""
    max_relay: Duration = Field(default=600.0, gt=0)
    """The most an answer's relay to its caller may last; then the caller is cut."""
    max_spool_total: Size = Field(default=1 << 30, ge=0)
    """Bytes all answers being spooled may hold on disk at once (per process); when
    it is reached, protected calls are refused `503 route-saturated` before their claim."""
    spool_dir: Path | None = None
    """Where spool files are made (unlinked at once, mode 0600, encrypted); None: the
    system's temporary directory."""
    trusted_proxies: tuple[IPvAnyNetwork, ...] = ()
    """Addresses (or networks) of proxies in front of the gateway whose `X-Forwarded-For`,
    `Forwarded`, `X-Forwarded-Host` and `X-Forwarded-Proto` are passed on (with this
    hop appended); from anyone else they are replaced with what the gateway saw."""


def _base64_bytes(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return b""


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
    history_key: SecretStr | None = None
    """Base64 of 32 random bytes, kept outside the store: operations' histories are then
    chained with HMAC, so editing one needs the key as well as the database. Not rotated:
    a store that met one key reports chains made with another as broken."""

    @field_validator("history_key")
    @classmethod
    def _check_history_key(cls, key: SecretStr | None) -> SecretStr | None:
        if key is not None and len(_base64_bytes(key.get_secret_value())) != 32:
            raise ValueError(
                "must be 32 random bytes in base64 (make one: python -c 'import os,base64;"
                "print(base64.b64encode(os.urandom(32)).decode())')"
            )
        return key

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
    """Requests of one scope in flight at once, every kind (gateway-wide: each of N
    workers allows `ceil(max_in_flight / N)`). Off, each scope still gets no more than
    half of a route's `max_concurrency` while others use the route."""
    max_streams: int = Field(default=16, ge=0)
    """MCP server streams (GET) one scope may hold open (gateway-wide, divided among
    workers like `max_in_flight`)."""
    new_keys_per_minute: int = Field(default=0, ge=0)
    """New keys one scope may start per minute (this process)."""
    max_operations: int = Field(default=0, ge=0)
    """Records one scope may keep in the store: operations (receipts and tombstones) and
    the bindings its `similar-operation` refusals left on keys, one each."""
    max_bindings: int = Field(default=1000, ge=0)
    """Bindings (`similar-operation` refusals) one scope may keep; past it such a refusal is
    `429 quota-exceeded` and binds nothing (0: no limit)."""
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


MIN_DISTINCT_TOKEN_CHARACTERS = 8
"""A random token of 24 characters or more has many more distinct characters (hex: 15 or
16 nearly always); one with fewer was typed, not generated."""


def guessable(token: str) -> str | None:
    """Why a long token is still easy to guess (a pattern a person types), or None.

    Said without quoting the token: the message goes to the log.

    >>> guessable("aaaaaaaaaaaaaaaaaaaaaaaa"), guessable("adminadminadminadminadmin")
    ('one short pattern repeated', 'one short pattern repeated')
    >>> guessable("123456789012345678901234")
    'one short pattern repeated'
    >>> guessable("abcdefghijklmnopqrstuvwxyz")
    'characters in sequence'
    >>> guessable("Zq4-7hL2pW9xR1vT8mK3nB6c") is None
    True
    """
    length = len(token)
    for period in range(1, length // 2 + 1):
        if all(token[i] == token[i % period] for i in range(length)):
            return "one short pattern repeated"
    steps = {ord(b) - ord(a) for a, b in itertools.pairwise(token)}
    if steps <= {1} or steps <= {-1} or steps <= {1, -9} or steps <= {-1, 9}:
        return "characters in sequence"
    if len(set(token)) < MIN_DISTINCT_TOKEN_CHARACTERS:
        return f"fewer than {MIN_DISTINCT_TOKEN_CHARACTERS} different characters"
    return None


AdminRole = Literal["viewer", "operator", "admin"]
"""What a named admin token may do: `viewer` reads; `operator` also resolves (without
force), probes and attaches receipts; `admin` also forces, redacts and trusts probes."""


class AdminToken(BaseModel):
    """A named admin token: the history names its holder, and its role bounds what it does.

    >>> AdminToken(name="ann", token_sha256="AB" * 32, role="operator").role
    'operator'
    """

    model_config = _SETTINGS_MODEL

    name: Name
    token_sha256: Annotated[str, AfterValidator(_sha256_hex)]
    role: AdminRole


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
    """One shared token, of role `admin` (the actor is what `X-Admin-Actor` says)."""
    tokens: tuple[AdminToken, ...] = ()
    """Named tokens (`[[admin.tokens]]`), each with a role; the actor is the name."""
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
        why = guessable(value)
        if why is not None:
            raise ValueError(f"is guessable ({why}): generate one with `idempotency-gateway token`")
        return token

    @field_validator("tokens")
    @classmethod
    def _unique_names(cls, tokens: tuple[AdminToken, ...]) -> tuple[AdminToken, ...]:
        names = [token.name for token in tokens]
        if twice := sorted({name for name in names if names.count(name) > 1}):
            raise ValueError(f"each named token needs a name of its own: {', '.join(twice)}")
        return tokens

    @property
    def enabled(self) -> bool:
        """The admin endpoints are on when any admin token exists."""
        return bool(self.token.get_secret_value()) or bool(self.tokens)


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


class MetricsSettings(BaseModel):
    """Where `/metrics` is served.

    `"main"` (the default, where Prometheus looks) shows every caller of the
    main listener the gateway-wide counts per route and outcome; `"admin"`
    serves it on the admin listener only (the main one answers 404), where
    tenants must not see each other's counts; `"both"` serves it on both.

    >>> MetricsSettings().listener
    'main'
    """

    model_config = _SETTINGS_MODEL

    listener: Literal["main", "admin", "both"] = "main"


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
    canonical_json: bool = True
    """False fingerprints JSON bodies as bytes, as before fingerprint version 2: only so
    that `bench.fingerprints` measures what canonical JSON costs on the miss path."""
