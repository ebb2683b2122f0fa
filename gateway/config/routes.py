"""Routes and their probes: which upstream a path reaches and how its calls are protected.

A route's settings decide what a probe can ask (the probe must name the value
the route forwards, or it would hear "not applied" about an effect that
exists), so the two models and that cross-check live together here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, Self
from urllib.parse import urlsplit, urlunsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

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
    max_call: Duration = Field(default=3600.0, gt=0)
    """MCP routes: the most a protected call may take; then it is `unknown`."""

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

    @model_validator(mode="before")
    @classmethod
    def _mcp_defaults(cls, data: Any) -> Any:
        # On an MCP route a call without a key passes through unless the route
        # asks for keys: MCP clients that cannot send one must keep working.
        if isinstance(data, dict) and data.get("kind") == "mcp" and "require_key" not in data:
            return {**data, "require_key": False}
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
        if (probe_problem := self._probe_path_problem()) is not None:
            problems.append((("probe", "path"), probe_problem))
        if problems:
            raise _Problems(*problems)
        return self

    def _mcp_problems(self) -> list[tuple[_Loc, str]]:
        problems: list[tuple[_Loc, str]] = []
        if self.probe is not None:
            problems.append(
                (("probe",), "an MCP route has no probe: a tool call cannot be looked up upstream")
            )
        if self.status_tool is not None and self.status_tool in self.protect_tools:
            problems.append(
                (("status_tool",), "is answered by the gateway; it cannot be protected")
            )
        return problems

    def _http_problems(self) -> list[tuple[_Loc, str]]:
        defaults = RouteSettings.model_fields
        return [
            ((name,), 'only applies to an MCP route (kind = "mcp")')
            for name in _MCP_ONLY
            if getattr(self, name) != defaults[name].default
        ]

    def _probe_path_problem(self) -> str | None:
        """Why the probe path cannot name the effect the upstream saw, if it cannot.

        A probe finds an effect by what this route forwarded. Asked about
        anything else, the upstream answers "not applied" for an effect that
        exists, the key is released, and the retry is a second effect.
        """
        if self.probe is None or self.kind == "mcp":
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


_MCP_ONLY = (
    "protect_tools",
    "skip_tools",
    "trust_read_only_hint",
    "derive_key",
    "derived_key_retention",
    "status_tool",
    "max_call",
    "cancel_hold",
)

_FORWARDED = {
    "operation_id": "the operation id",
    "scoped": "the scoped key (<scope label>:<key>)",
    "key": "the caller's key",
}
