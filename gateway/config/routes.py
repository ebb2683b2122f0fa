"""Routes and their probes: which upstream a path reaches and how its calls are protected.

A route's settings decide what a probe can ask (the probe must name the value
the route forwards, or it would hear "not applied" about an effect that
exists), so the two models and that cross-check live together here.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, Literal, Self
from urllib.parse import urlsplit, urlunsplit

from jsonpointer import JsonPointer, JsonPointerException
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gateway.config.applies_to import AppliesTo, parse_entry
from gateway.config.fields import (
    _PLACEHOLDER_RE,
    _SETTINGS_MODEL,
    Duration,
    ForwardKey,
    HeaderName,
    HttpMethod,
    HttpStatus,
    Name,
    Size,
    _expand_env,
    _expand_headers,
    _forward_key,
    _Loc,
    _not_empty,
    _Problems,
)


def _tool_name(value: str) -> str:
    if not value or len(value) > 128 or any(not " " < char <= "~" for char in value):
        raise ValueError(f"invalid tool name {value!r}: 1-128 printable ASCII characters")
    return value


ToolName = Annotated[str, AfterValidator(_tool_name)]


_PLACEHOLDERS = frozenset({"key", "operation_id", "forwarded_key"})

_MCP_PROBE_HEADERS = frozenset(
    {"mcp-session-id", "mcp-protocol-version", "mcp-method", "mcp-name", "last-event-id"}
)
"""Headers an MCP probe sets itself: its session and protocol are its own, never a caller's."""


def _unknown_placeholder(text: str) -> str | None:
    unknown = set(_PLACEHOLDER_RE.findall(text)) - _PLACEHOLDERS
    if not unknown:
        return None
    return (
        f"unknown placeholder {{{sorted(unknown)[0]}}}: "
        "only {key}, {operation_id} and {forwarded_key}"
    )


def _json_problems(value: object, loc: _Loc) -> list[tuple[_Loc, str]]:
    """Why `value` cannot be sent as JSON tool arguments, at each place it cannot."""
    if value is None or isinstance(value, bool | int | str):
        problem = _unknown_placeholder(value) if isinstance(value, str) else None
        return [] if problem is None else [(loc, problem)]
    if isinstance(value, float):
        return [] if math.isfinite(value) else [(loc, f"{value} has no JSON form")]
    if isinstance(value, list):
        return [
            problem for i, item in enumerate(value) for problem in _json_problems(item, (*loc, i))
        ]
    if isinstance(value, dict):
        return [
            problem
            for name, item in value.items()
            for problem in (
                _json_problems(item, (*loc, name))
                if isinstance(name, str)
                else [(loc, f"member name {name!r} is not a string")]
            )
        ]
    return [(loc, f"{type(value).__name__} values (TOML dates and times) have no JSON form")]


def _strings_in(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [text for item in value for text in _strings_in(item)]
    if isinstance(value, dict):
        return [text for item in value.values() for text in _strings_in(item)]
    return []


class ProbeSettings(BaseModel):
    """How to ask an upstream whether an `unknown` effect exists.

    An HTTP route's probe is a request: `{forwarded_key}` in `path` is
    replaced (URL-encoded) by what the route forwarded for the operation, and
    the answer's status is the verdict. An MCP route's probe is a call of a
    tool of the same server (`tool`, `arguments`, in whose strings the same
    placeholders are replaced), judged by the boolean at `applied_pointer` in
    the result's `structuredContent`. `{key}` and `{operation_id}` are
    accepted where they equal the forwarded key. The route checks that the
    probe names what it forwards, and which keys its kind takes.

    >>> ProbeSettings(path="/v1/issues?client_ref={forwarded_key}").not_applied_after
    300.0
    >>> mcp = ProbeSettings(tool="find_ticket", arguments={"ref": "{forwarded_key}"},
    ...                     applied_pointer="/found")
    >>> mcp.tool, mcp.path
    ('find_ticket', None)
    """

    model_config = _SETTINGS_MODEL

    # HTTP routes.
    method: HttpMethod = "GET"
    path: str | None = None
    applied_statuses: tuple[HttpStatus, ...] = (200,)
    not_applied_statuses: tuple[HttpStatus, ...] = (404,)
    # MCP routes.
    tool: ToolName | None = None
    arguments: dict[str, Any] = Field(default_factory=dict)
    applied_pointer: str | None = None
    # Both.
    not_applied_after: Duration = 300.0
    headers: dict[str, str] = Field(default_factory=dict)
    applies_to: tuple[str, ...] = ()
    """The requests this probe can answer for: `"METHOD /path"` entries in the upstream's
    terms (HTTP; a `*` segment matches any one segment) or tool names (MCP). Its "found"
    settles any operation of the route; its "not found" releases only what these cover
    (none: it never releases, and check-config warns)."""
    sees_all_callers: bool = False
    """The probe's credentials (the route's `upstream_headers`, its own `headers`) see
    every caller's effects. Required when the route passes callers' own credentials on:
    otherwise the probe may ask as another principal and read "not found"."""

    @field_validator("applied_statuses")
    @classmethod
    def _check_applied(cls, statuses: tuple[int, ...]) -> tuple[int, ...]:
        return _not_empty(statuses, "a probe needs at least one status that means applied")

    @field_validator("path")
    @classmethod
    def _check_path(cls, path: str | None) -> str | None:
        if path is None:
            return path
        if not path.startswith("/"):
            raise ValueError(f"must start with '/', got {path!r}")
        if any(not "!" <= char <= "~" for char in path):
            raise ValueError("must not contain spaces, control or non-ASCII characters")
        if (problem := _unknown_placeholder(path)) is not None:
            raise ValueError(problem)
        return path

    @field_validator("arguments")
    @classmethod
    def _check_arguments(cls, arguments: dict[str, Any]) -> dict[str, Any]:
        problems = _json_problems(arguments, ())
        if problems:
            raise _Problems(*problems)
        return arguments

    @field_validator("applied_pointer")
    @classmethod
    def _check_pointer(cls, pointer: str | None) -> str | None:
        if pointer is None:
            return pointer
        try:
            JsonPointer(pointer)
        except JsonPointerException as exc:
            raise ValueError(f"not a JSON pointer (RFC 6901): {exc}") from exc
        if pointer == "":
            raise ValueError(
                "'' points at the whole structuredContent, an object; point at the "
                'boolean inside it that says whether the effect exists (e.g. "/found")'
            )
        return pointer

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

    def http_problems(self) -> list[tuple[_Loc, str]]:
        """What an HTTP route cannot take in this probe (MCP keys) or misses (`path`)."""
        problems: list[tuple[_Loc, str]] = [
            ((name,), 'only applies to an MCP route\'s probe (kind = "mcp")')
            for name in _MCP_PROBE_ONLY
            if getattr(self, name) != _default(name)
        ]
        if self.path is None:
            problems.append(
                (
                    ("path",),
                    "required key is missing: an HTTP route's probe asks a path "
                    "(e.g. '/v1/issues?ref={forwarded_key}')",
                )
            )
        return problems

    def mcp_problems(self) -> list[tuple[_Loc, str]]:
        """What an MCP route cannot take in this probe (HTTP keys) or misses."""
        problems: list[tuple[_Loc, str]] = [
            (
                (name,),
                "only applies to an HTTP route's probe; an MCP route's probe calls a tool "
                "(tool, arguments, applied_pointer)",
            )
            for name in _HTTP_PROBE_ONLY
            if getattr(self, name) != _default(name)
        ]
        if self.tool is None:
            problems.append(
                (
                    ("tool",),
                    "required key is missing: an MCP route's probe names a tool of the same "
                    'server that looks the effect up (e.g. "find_ticket")',
                )
            )
        if self.applied_pointer is None:
            problems.append(
                (
                    ("applied_pointer",),
                    "required key is missing: a JSON pointer into the tool result's "
                    'structuredContent, to true (applied) or false (not applied), e.g. "/found"',
                )
            )
        problems.extend(
            (("headers", name), "the probe sets this header itself (its session is its own)")
            for name in self.headers
            if name.lower() in _MCP_PROBE_HEADERS
        )
        return problems


_HTTP_PROBE_ONLY = ("method", "path", "applied_statuses", "not_applied_statuses")
_MCP_PROBE_ONLY = ("tool", "arguments", "applied_pointer")


def _default(name: str) -> object:
    return ProbeSettings.model_fields[name].get_default(call_default_factory=True)


DEFAULT_REQUEST_REDACTIONS = (
    "api_key",
    "apikey",
    "access_token",
    "refresh_token",
    "token",
    "password",
    "secret",
    "client_secret",
    "authorization",
)
"""Secret-shaped names whose values an operator never needs to settle an operation."""


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
    max_spool: Size = 64 << 20
    """An answer larger than `max_stored_response` is spooled to disk up to this size and
    relayed from there, so the caller's reading speed never decides its outcome; past it
    the outcome is recorded (completed, body not kept) and the rest relayed as read."""
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
    max_call: Duration = Field(default=3600.0, gt=0)
    """MCP routes: the most a protected call may take; then it is `unknown`."""
    max_stream: Duration = Field(default=3600.0, gt=0)
    """MCP routes: the most an answer passed through (a server stream above all) may
    last, however lively; then the gateway ends it and the client reconnects."""
    not_applied_after: Duration = Field(default=300.0, ge=0)
    """How long after an attempt's last possible send (plus `timeout`) an owner or an
    admin may release it `not_applied` without `force`: the tool may still be applying
    a send it received late (the `too-early` guard)."""
    record_raw: bool = False
    """Record a body redaction cannot read (a content type other than JSON, a form or
    multipart; JSON that does not parse) as sent, instead of its size and digest only."""
    record_request_max: Size = 64 << 10
    """The largest request body recorded with its operation for operators (0: none);
    a larger one keeps its size and SHA-256 only."""
    redact_request: tuple[str, ...] = DEFAULT_REQUEST_REDACTIONS
    """Query parameter names, JSON member names (at any depth, any case) and JSON
    pointers (`/payment/card`) whose values are replaced before a request is recorded."""
    similar_window: Duration = Field(default=900.0, ge=0)
    """How long after a twin's current attempt a new key for the same request is
    refused `similar-operation` (0: never)."""
    similar_guard: Literal["unsettled", "all", "off"] = "unsettled"
    """Which twins refuse a new key: `in_flight` and `unknown` ones, completed ones too,
    or none."""

    # MCP routes (`kind = "mcp"`): the route fronts one Streamable HTTP endpoint.
    kind: Literal["http", "mcp"] = "http"
    protect_tools: tuple[ToolName, ...] = ("*",)
    skip_tools: tuple[ToolName, ...] = ()
    trust_read_only_hint: bool = True
    derive_key: Literal["arguments", False] = False
    derived_key_retention: Duration = Field(default=600.0, gt=0)
    status_tool: ToolName | None = None
    cancel_hold: Duration = Field(default=1.0, gt=0)
    """MCP routes: how long a `notifications/cancelled` naming a request id no worker
    knows yet waits for that id before it is forwarded (with workers, the cancellation
    may reach a worker before the call it names is announced there)."""
    command: tuple[Annotated[str, Field(min_length=1)], ...] | None = Field(
        default=None, min_length=1
    )
    """MCP routes: the stdio server to start instead of an `upstream` (the program and
    its arguments): one per worker and caller scope, spoken to over its stdin/stdout."""
    env: dict[str, str] = Field(default_factory=dict)
    """A stdio server's environment (`${VAR}` from the gateway's): only this, `PATH` and
    `HOME` reach it."""
    shared_tenants: bool = False
    """One stdio server per worker for every caller scope (it keeps no caller's state)."""
    shared_state: bool = False
    """The stdio servers share what they know (a database, files): a probe's "not
    found" from another child than the one that made the call may release it."""
    max_children: int = Field(default=16, ge=1)
    """Stdio servers per worker at most (one per scope); the idlest stops for a new one."""
    run_as: str | None = None
    """Start the stdio servers as this user (the gateway must run as root): otherwise
    they can read whatever the gateway can, its store included."""

    @model_validator(mode="before")
    @classmethod
    def _mcp_defaults(cls, data: Any) -> Any:
        # On an MCP route a call without a key passes through unless the route
        # asks for keys: MCP clients that cannot send one must keep working.
        if isinstance(data, dict) and data.get("kind") == "mcp" and "require_key" not in data:
            data = {**data, "require_key": False}
        # A stdio route has no URL: its requests go to its children (`gateway.mcp.stdio_upstream`).
        if isinstance(data, dict) and data.get("command") is not None and "upstream" not in data:
            data = {**data, "upstream": STDIO_UPSTREAM}
        return data

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

    @field_validator("env")
    @classmethod
    def _check_env(cls, env: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        return _expand_env(env, info)

    @model_validator(mode="after")
    def _check_combinations(self) -> Self:
        problems: list[tuple[_Loc, str]] = []
        if self.tls_client_key is not None and self.tls_client_cert is None:
            problems.append((("tls_client_key",), "needs tls_client_cert"))
        if not self.upstream.startswith("https://"):
            for name in ("tls_ca", "tls_client_cert", "tls_client_key"):
                if getattr(self, name) is not None:
                    problems.append(((name,), "only applies to an https:// upstream"))
        if self.kind == "mcp":
            problems.extend(self._mcp_problems())
        else:
            problems.extend(self._http_problems())
        problems.extend(self._probe_problems())
        if problems:
            raise _Problems(*problems)
        return self

    def _mcp_problems(self) -> list[tuple[_Loc, str]]:
        problems: list[tuple[_Loc, str]] = []
        if self.command is not None and self.upstream != STDIO_UPSTREAM:
            problems.append((("command",), "a route has a command or an upstream, not both"))
        if self.command is None:
            for name in STDIO_ONLY:
                if getattr(self, name) != RouteSettings.model_fields[name].get_default(
                    call_default_factory=True
                ):
                    problems.append(((name,), "only applies to a stdio route (command = [...])"))
        if self.status_tool is not None and self.status_tool in self.protect_tools:
            problems.append(
                (("status_tool",), "is answered by the gateway; it cannot be protected")
            )
        return problems

    def _http_problems(self) -> list[tuple[_Loc, str]]:
        defaults = RouteSettings.model_fields
        return [
            ((name,), 'only applies to an MCP route (kind = "mcp")')
            for name in MCP_ONLY
            if getattr(self, name) != defaults[name].get_default(call_default_factory=True)
        ]

    def _probe_problems(self) -> list[tuple[_Loc, str]]:
        """The probe's keys checked against the route's kind, and what it names."""
        probe = self.probe
        if probe is None:
            return []
        own = probe.mcp_problems() if self.kind == "mcp" else probe.http_problems()
        problems = [(("probe", *loc), message) for loc, message in own]
        problems.extend(self._applies_to_problems(probe))
        if self.kind == "mcp":
            problems.extend(self._mcp_probe_problems(probe))
        if not own and (named := self._probe_names_problem(probe)) is not None:
            where = "arguments" if self.kind == "mcp" else "path"
            problems.append((("probe", where), named))
        return problems

    def _applies_to_problems(self, probe: ProbeSettings) -> list[tuple[_Loc, str]]:
        problems: list[tuple[_Loc, str]] = []
        for i, text in enumerate(probe.applies_to):
            try:
                if self.kind == "mcp":
                    _tool_name(text)
                else:
                    parse_entry(text)
            except ValueError as exc:
                problems.append((("probe", "applies_to", i), str(exc)))
        return problems

    def applies_to(self) -> tuple[AppliesTo, ...]:
        """The probe's HTTP `applies_to` entries, parsed (none on MCP routes: tool names)."""
        if self.probe is None or self.kind == "mcp":
            return ()
        return tuple(parse_entry(text) for text in self.probe.applies_to)

    def _mcp_probe_problems(self, probe: ProbeSettings) -> list[tuple[_Loc, str]]:
        problems: list[tuple[_Loc, str]] = []
        if probe.tool is not None and probe.tool == self.status_tool:
            problems.append(
                (("probe", "tool"), "is the gateway's status tool; the server does not have it")
            )
        mode = self.forward_key
        if self.derive_key == "arguments" and mode in ("scoped", "key"):
            problems.append(
                (
                    ("forward_key",),
                    f'route "{self.name}" derives keys and has a probe: a derived-key call '
                    f"forwards the operation id, where the probe would name {_FORWARDED[mode]}; "
                    'use forward_key = "operation_id" (one value for both)',
                )
            )
        return problems

    def _probe_names_problem(self, probe: ProbeSettings) -> str | None:
        """Why the probe cannot name the effect the upstream saw, if it cannot.

        A probe finds an effect by what this route forwarded. Asked about
        anything else, the upstream answers "not applied" for an effect that
        exists, the key is released, and the retry is a second effect.
        """
        route = f'route "{self.name}"'
        texts = [probe.path or ""] if self.kind == "http" else _strings_in(probe.arguments)
        named = {name for text in texts for name in _PLACEHOLDER_RE.findall(text)}
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
        if not named & _PLACEHOLDERS:
            where = "a string of the arguments" if self.kind == "mcp" else "the path"
            return (
                f"names no effect: {route}'s probe would ask the same question for every "
                f"operation; put {{forwarded_key}} (what the route forwards) in {where}"
            )
        return None


MCP_ONLY: tuple[str, ...] = (
    "protect_tools",
    "skip_tools",
    "trust_read_only_hint",
    "derive_key",
    "derived_key_retention",
    "status_tool",
    "max_call",
    "max_stream",
    "cancel_hold",
    "command",
    "env",
    "shared_tenants",
    "shared_state",
    "max_children",
    "run_as",
)

STDIO_ONLY: tuple[str, ...] = ("env", "shared_tenants", "shared_state", "max_children", "run_as")
"""Keys of a stdio MCP route (`command = [...]`) only."""

STDIO_UPSTREAM = "http://stdio.invalid"
"""A stdio route's `upstream`: its requests go to its children, in process
(`gateway.mcp.stdio_upstream`), never to a URL; `.invalid` never resolves, so nothing
could be sent anywhere real through it."""

_FORWARDED = {
    "operation_id": "the operation id",
    "scoped": "the scoped key (<scope label>:<key>)",
    "key": "the caller's key",
}
