"""Configuration: defaults, the example file, precedence, validation and rendering."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from pydantic import ValidationError

from gateway.config import (
    GATEWAY_PATHS,
    RouteSettings,
    Settings,
    StoreSettings,
    load_settings,
    render_effective,
)
from gateway.config.routes import MCP_ONLY, STDIO_ONLY
from gateway.engine.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Mapping

EXAMPLE = Path(__file__).resolve().parent.parent / "config" / "gateway.toml"

ROUTE = """
[[routes]]
name = "tickets"
prefix = "/tickets"
upstream = "http://127.0.0.1:9000"
"""
PROBE = "[routes.probe]\npath = '/x/{forwarded_key}'\nsees_all_callers = true"

DIGEST_A = "a" * 64
DIGEST_B = "b" * 64


@pytest.fixture
def load(tmp_path: Path) -> Any:
    """Load a config written from TOML text, with its own environment and overrides."""

    def _load(
        text: str,
        *,
        environ: Mapping[str, str] | None = None,
        overrides: Mapping[str, Any] | None = None,
    ) -> Settings:
        path = tmp_path / "gateway.toml"
        path.write_text(text)
        return load_settings(path, environ=environ or {}, overrides=overrides)

    return _load


def refusal(load: Any, text: str, **kwargs: Any) -> str:
    """The message of the ConfigError that loading `text` raises."""
    with pytest.raises(ConfigError) as caught:
        load(text, **kwargs)
    return str(caught.value)


# -- defaults, file resolution and precedence ------------------------------------


def test_defaults_without_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without an explicit file and without config/gateway.toml, defaults apply, no routes."""
    monkeypatch.chdir(tmp_path)
    settings = load_settings(environ={})
    assert settings == Settings()
    assert (settings.server.host, settings.server.port) == ("127.0.0.1", 8080)
    assert settings.store.url == "sqlite:///./data/gateway.db"
    assert settings.store.pool_size == 10
    assert settings.store.busy_timeout == 5.0
    assert settings.idempotency.scope_headers == ("Authorization",)
    assert settings.idempotency.retention == 86400.0
    assert settings.idempotency.tombstone_retention == 30 * 86400.0
    assert settings.idempotency.lease == 30.0
    assert settings.idempotency.max_wait == 30.0
    assert settings.idempotency.sweep_interval == 60.0
    assert not settings.admin.enabled
    assert (settings.admin.host, settings.admin.port) == ("127.0.0.1", 8081)
    assert settings.clients == ()
    assert settings.routes == ()
    assert (settings.logging.level, settings.logging.format) == ("info", "json")
    assert settings.testing.fault is None


def test_route_defaults() -> None:
    """A route with only its required keys gets the documented defaults."""
    route = RouteSettings(name="t", prefix="/t", upstream="http://h")
    assert route.methods == ("POST", "PATCH")
    assert route.require_key is True
    assert (route.timeout, route.keepalive) == (30.0, 4.0)
    assert route.max_body == route.max_stored_response == 1 << 20
    assert route.max_concurrency == 256
    assert route.forward_key == "operation_id"
    assert route.clients is None
    assert route.release_statuses == (429,)
    assert route.redact_response_headers == ("set-cookie",)
    assert route.tls_ca is route.tls_client_cert is route.tls_client_key is None
    assert route.upstream_headers == {}
    assert route.probe is None


def test_example_file_loads() -> None:
    """The config/gateway.toml that `make run` serves is valid and says what the contract says."""
    settings = load_settings(EXAMPLE, environ={})
    assert (settings.server.host, settings.server.port) == ("127.0.0.1", 8080)
    assert settings.store.url == "sqlite:///./data/gateway.db"
    route, mcp, stdio = settings.routes
    assert (stdio.kind, stdio.prefix, stdio.shared_tenants, stdio.shared_state) == (
        "mcp", "/mcp-stdio", False, False,
    )  # fmt: skip
    assert stdio.command == ("python3", "-m", "examples.mcp_server", "--stdio")
    assert (route.name, route.prefix, route.upstream) == (
        "tickets",
        "/tickets",
        "http://127.0.0.1:9000",
    )
    assert (mcp.kind, mcp.prefix, mcp.upstream) == ("mcp", "/mcp", "http://127.0.0.1:9100/mcp")
    assert (mcp.require_key, mcp.forward_key) == (False, "operation_id")
    assert mcp.probe is not None
    assert (mcp.probe.tool, mcp.probe.arguments, mcp.probe.applied_pointer) == (
        "find_ticket",
        {"idempotency_key": "{forwarded_key}"},
        "/found",
    )
    assert (mcp.probe.path, mcp.probe.not_applied_after) == (None, 300.0)
    assert route.max_body == 1 << 20
    assert route.forward_key == "operation_id"
    assert route.probe is not None
    assert route.probe.path == "/v1/issues?idempotency_key={forwarded_key}"
    assert route.probe.applied_statuses == (200,)
    assert route.probe.not_applied_statuses == (404,)
    assert route.probe.not_applied_after == 300.0


def test_example_file_shows_every_route_key() -> None:
    """Every route and probe key appears in the example, set or commented out."""
    text = EXAMPLE.read_text()
    for key in [*RouteSettings.model_fields, "method", "path", "applied_statuses"]:
        assert f"{key} =" in text or f"[routes.{key}]" in text, key


def test_default_path_is_used_when_present(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """config/gateway.toml in the current directory is read when no path is given."""
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "gateway.toml").write_text("[server]\nport = 7000\n")
    monkeypatch.chdir(tmp_path)
    assert load_settings(environ={}).server.port == 7000


def test_config_env_var_names_the_file(tmp_path: Path) -> None:
    """IDEMPOTENCY_GATEWAY_CONFIG names the file when no path is given."""
    path = tmp_path / "other.toml"
    path.write_text("[server]\nport = 7001\n")
    assert load_settings(environ={"IDEMPOTENCY_GATEWAY_CONFIG": str(path)}).server.port == 7001


def test_explicit_missing_file_is_an_error(tmp_path: Path) -> None:
    """A config file that was asked for but does not exist is refused, naming it."""
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError, match=r"nope\.toml"):
        load_settings(missing, environ={})
    with pytest.raises(ConfigError, match="IDEMPOTENCY_GATEWAY_CONFIG"):
        load_settings(environ={"IDEMPOTENCY_GATEWAY_CONFIG": str(missing)})


def test_invalid_toml_names_the_file(load: Any) -> None:
    """A file that is not TOML is refused with its path and the parser's position."""
    message = refusal(load, "[server\nport = 1\n")
    assert "gateway.toml" in message
    assert "not valid TOML" in message
    assert "line 1" in message


def test_env_beats_file_and_overrides_beat_env(load: Any) -> None:
    """Environment variables override the file; overrides override both."""
    text = "[server]\nport = 7000\nhost = '0.0.0.0'\n"
    env = {"IDEMPOTENCY_GATEWAY_SERVER__PORT": "9999"}
    assert load(text).server.port == 7000
    assert load(text, environ=env).server.port == 9999
    assert load(text, environ=env).server.host == "0.0.0.0"
    settings = load(text, environ=env, overrides={"server.port": 0, "server.host": "::1"})
    assert (settings.server.host, settings.server.port) == ("::1", 0)


def test_env_values_are_coerced_and_json_parsed(load: Any) -> None:
    """Env strings are coerced by type; values that look like JSON are parsed as JSON."""
    env = {
        "IDEMPOTENCY_GATEWAY_ADMIN__TOKEN": "s3cret-admin-token-0123456789",
        "IDEMPOTENCY_GATEWAY_IDEMPOTENCY__SCOPE_HEADERS": '["X-Api-Key", "X-Tenant"]',
        "IDEMPOTENCY_GATEWAY_IDEMPOTENCY__LEASE": "45s",
        "IDEMPOTENCY_GATEWAY_LOGGING__LEVEL": "DEBUG",
        "IDEMPOTENCY_GATEWAY_ROUTES__0__REQUIRE_KEY": "false",
        "IDEMPOTENCY_GATEWAY_ROUTES__0__FORWARD_KEY": "operation_id",
        "IDEMPOTENCY_GATEWAY_ROUTES__0__MAX_BODY": "64KiB",
        "UNRELATED": "ignored",
    }
    settings = load(ROUTE, environ=env)
    assert settings.admin.token.get_secret_value() == "s3cret-admin-token-0123456789"
    assert settings.admin.enabled
    assert settings.idempotency.scope_headers == ("X-Api-Key", "X-Tenant")
    assert settings.idempotency.lease == 45.0
    assert settings.logging.level == "debug"
    route = settings.routes[0]
    assert (route.require_key, route.forward_key, route.max_body) == (False, "operation_id", 65536)


def test_env_header_override_matches_existing_case(load: Any) -> None:
    """An upper-cased env name replaces a header of the file whatever the file's case."""
    text = ROUTE + '[routes.upstream_headers]\nAuthorization = "Bearer old"\n'
    env = {"IDEMPOTENCY_GATEWAY_ROUTES__0__UPSTREAM_HEADERS__AUTHORIZATION": "Bearer new"}
    assert load(text, environ=env).routes[0].upstream_headers == {"Authorization": "Bearer new"}


def test_env_cannot_address_a_missing_route(load: Any) -> None:
    """An env var indexing a route the file does not have is refused, naming the var."""
    message = refusal(load, ROUTE, environ={"IDEMPOTENCY_GATEWAY_ROUTES__3__TIMEOUT": "1s"})
    assert "IDEMPOTENCY_GATEWAY_ROUTES__3__TIMEOUT" in message
    assert "routes[3].timeout" in message


def test_env_invalid_json_is_refused(load: Any) -> None:
    """An env value that starts like JSON but is not valid JSON is refused, naming the var."""
    env = {"IDEMPOTENCY_GATEWAY_IDEMPOTENCY__SCOPE_HEADERS": '["X-Api-Key"'}
    assert "IDEMPOTENCY_GATEWAY_IDEMPOTENCY__SCOPE_HEADERS" in refusal(load, "", environ=env)


def test_overrides_accept_index_forms(load: Any) -> None:
    """Overrides address routes as routes[0].key or routes.0.key."""
    settings = load(ROUTE, overrides={"routes[0].timeout": "10s", "routes.0.keepalive": "1s"})
    assert (settings.routes[0].timeout, settings.routes[0].keepalive) == (10.0, 1.0)


def test_error_names_the_source_of_the_value(load: Any) -> None:
    """A bad value from the environment or an override says where it came from."""
    env = {"IDEMPOTENCY_GATEWAY_SERVER__PORT": "99999"}
    message = refusal(load, "", environ=env)
    assert "server.port:" in message
    assert "99999" in message
    assert "IDEMPOTENCY_GATEWAY_SERVER__PORT" in message
    message = refusal(load, "", overrides={"server.port": -1})
    assert "server.port:" in message
    assert "override 'server.port'" in message


def test_error_names_the_file(load: Any, tmp_path: Path) -> None:
    """A bad value from the file names the file it came from."""
    message = refusal(load, "[server]\nport = 99999\n")
    assert str(tmp_path / "gateway.toml") in message
    assert "server.port:" in message
    assert "99999" in message


def test_every_problem_is_reported(load: Any) -> None:
    """All problems are listed, one line each, not only the first."""
    message = refusal(load, "[server]\nport = -1\n[store]\npool_size = 0\n")
    lines = message.splitlines()
    assert any(line.strip().startswith("server.port:") for line in lines)
    assert any(line.strip().startswith("store.pool_size:") for line in lines)


# -- validation rules --------------------------------------------------------------

REFUSED = [
    ("[server]\nport = 70000", "server.port:"),
    ("[server]\nport = 'http'", "server.port:"),
    ("[store]\nurl = 'mysql://x/y'", "store.url: unsupported store URL"),
    ("[store]\nurl = 'sqlite://relative.db'", "store.url:"),
    ("[store]\nurl = 'sqlite:///'", "store.url:"),
    ("[store]\npool_size = 0", "store.pool_size:"),
    ("[store]\nbusy_timeout = 'soon'", "store.busy_timeout: invalid duration 'soon'"),
    (
        "[idempotency]\nretention = '24h'\ntombstone_retention = '1h'",
        "idempotency.tombstone_retention: must be at least retention (1d), got 1h",
    ),
    ("[idempotency]\nscope_headers = ['X Api']", "idempotency.scope_headers[0]:"),
    ("[idempotency]\nlease = '0s'", "idempotency.lease:"),
    ("[idempotency]\nmax_wait = '-1s'", "idempotency.max_wait: invalid duration '-1s'"),
    ("[admin]\nlisten = 'nowhere'", "admin.listen: expected HOST:PORT"),
    ("[admin]\nlisten = '127.0.0.1:1'\nport = 2", "admin.listen: give host and port, or"),
    ("[admin]\nport = 70000", "admin.port:"),
    ("[admin]\ntoken = 'with space'", "admin.token: must be printable ASCII"),
    ("[logging]\nlevel = 'verbose'", "logging.level:"),
    ("[logging]\nformat = 'xml'", "logging.format:"),
    ("[[clients]]\nname = 'a'\ntoken_sha256 = ['abc']", "clients[0].token_sha256[0]:"),
    ("[[clients]]\nname = 'a'\ntoken_sha256 = []", "clients[0].token_sha256:"),
    ("[[clients]]\nname = 'a b'\ntoken_sha256 = ['" + DIGEST_A + "']", "clients[0].name:"),
    (
        f"[[clients]]\nname = 'a'\ntoken_sha256 = ['{DIGEST_A}']\n"
        f"[[clients]]\nname = 'a'\ntoken_sha256 = ['{DIGEST_B}']",
        "clients[1].name: duplicate client name 'a'",
    ),
    (
        f"[[clients]]\nname = 'a'\ntoken_sha256 = ['{DIGEST_A}']\n"
        f"[[clients]]\nname = 'b'\ntoken_sha256 = ['{DIGEST_B}', '{DIGEST_A.upper()}']",
        "clients[1].token_sha256[1]: this digest also belongs to clients[0]",
    ),
    ("[[routes]]\nprefix = '/t'\nupstream = 'http://h'", "routes[0].name: required key is missing"),
    (ROUTE + "timeout = 'abc'", "routes[0].timeout: invalid duration 'abc'"),
    (ROUTE + "timeout = '0s'", "routes[0].timeout:"),
    (ROUTE + "max_body = '1MB'", "routes[0].max_body: invalid size '1MB'"),
    (ROUTE + "max_stored_response = -1", "routes[0].max_stored_response: invalid size -1"),
    (ROUTE + "max_concurrency = 0", "routes[0].max_concurrency:"),
    (ROUTE + "forward_key = 'yes'", "routes[0].forward_key: invalid forward_key 'yes'"),
    (ROUTE + "release_statuses = [200]", "routes[0].release_statuses[0]:"),
    (ROUTE + "methods = ['PO ST']", "routes[0].methods[0]:"),
    (ROUTE + "redact_response_headers = ['bad header']", "routes[0].redact_response_headers[0]:"),
    (ROUTE + "tls_client_key = '/k.pem'", "routes[0].tls_client_key: needs tls_client_cert"),
    (ROUTE + "tls_ca = '/ca.pem'", "routes[0].tls_ca: only applies to an https:// upstream"),
    ("[[routes]]\nname = 't'\nprefix = 'tickets'\nupstream = 'http://h'", "routes[0].prefix:"),
    ("[[routes]]\nname = 't'\nprefix = '/'\nupstream = 'http://h'", "routes[0].prefix: '/'"),
    ("[[routes]]\nname = 't'\nprefix = '/a?b'\nupstream = 'http://h'", "routes[0].prefix:"),
    (
        "[[routes]]\nname = 't'\nprefix = '/t'\nupstream = 'ftp://h'",
        "routes[0].upstream: must be an http:// or https:// URL",
    ),
    ("[[routes]]\nname = 't'\nprefix = '/t'\nupstream = 'http://'", "routes[0].upstream:"),
    (
        "[[routes]]\nname = 't'\nprefix = '/t'\nupstream = 'http://h/x?y=1'",
        "routes[0].upstream: must not have a query",
    ),
    ("[[routes]]\nname = 't'\nprefix = '/t'\nupstream = 'http://h/#f'", "routes[0].upstream:"),
    ("[[routes]]\nname = 't'\nprefix = '/t'\nupstream = 'http://h:99999'", "routes[0].upstream:"),
    (
        "[[routes]]\nname = 't'\nprefix = '/t'\nupstream = 'http://u:pw@h'",
        "routes[0].upstream: must not hold credentials",
    ),
    ("[[routes]]\nname = 't t'\nprefix = '/t'\nupstream = 'http://h'", "routes[0].name:"),
    (ROUTE + ROUTE.replace("/tickets", "/other"), "routes[1].name: duplicate route name"),
    (ROUTE + ROUTE.replace('"tickets"', '"other"'), "routes[1].prefix: duplicate prefix"),
    (
        ROUTE + "[routes.upstream_headers]\n'Content-Length' = '1'",
        "routes[0].upstream_headers.Content-Length: the gateway sets this header itself",
    ),
    (
        ROUTE + "[routes.upstream_headers]\nIdempotency-Key = 'k'",
        "routes[0].upstream_headers.Idempotency-Key:",
    ),
    (
        ROUTE + "[routes.upstream_headers]\n'X Bad' = 'v'",
        'routes[0].upstream_headers."X Bad": not a valid header name',
    ),
    (
        ROUTE + "[routes.upstream_headers]\nX-A = 'a'\nx-a = 'b'",
        "routes[0].upstream_headers.x-a: the header is given twice",
    ),
    (ROUTE + '[routes.upstream_headers]\nX-A = "a\\nb"', "routes[0].upstream_headers.X-A:"),
    (ROUTE + "[routes.probe]\npath = 'v1/issues'", "routes[0].probe.path: must start with '/'"),
    (ROUTE + PROBE + "\nmethod = 'G T'", "routes[0].probe.method:"),
    (ROUTE + "[routes.probe]\npath = '/x/{id}'", "routes[0].probe.path: unknown placeholder {id}"),
    (
        ROUTE + PROBE + "\nnot_applied_statuses = [404, 200]",
        "routes[0].probe.not_applied_statuses: [200] also in applied_statuses",
    ),
    (
        ROUTE + PROBE + "\napplied_statuses = [99]",
        "routes[0].probe.applied_statuses[0]:",
    ),
    (
        ROUTE + PROBE + "\napplied_statuses = []",
        "routes[0].probe.applied_statuses: a probe needs at least one status",
    ),
    (
        ROUTE + PROBE + "\nnot_applied_after = '5 min'",
        "routes[0].probe.not_applied_after: invalid duration",
    ),
    (
        ROUTE + "forward_key = 'scoped'\n[routes.probe]\npath = '/x/{operation_id}'",
        'routes[0].probe.path: {operation_id} needs forward_key = "operation_id"',
    ),
    (
        ROUTE + "[routes.probe]\npath = '/x?ref={key}'",
        'routes[0].probe.path: {key} needs forward_key = "key": route "tickets" forwards',
    ),
    (
        ROUTE + "forward_key = false\n[routes.probe]\npath = '/x/{forwarded_key}'",
        'routes[0].probe.path: route "tickets" has forward_key = false',
    ),
    (
        ROUTE + "[routes.probe]\npath = '/x'",
        'routes[0].probe.path: names no effect: route "tickets"\'s probe',
    ),
    (
        ROUTE + PROBE + "\n[routes.probe.headers]\nConnection = 'close'",
        "routes[0].probe.headers.Connection:",
    ),
    (ROUTE + "kind = 'mcp'\ncancel_hold = 'soon'", "routes[0].cancel_hold: invalid duration"),
    (ROUTE + "kind = 'mcp'\ncancel_hold = 0", "routes[0].cancel_hold:"),
    (ROUTE + "cancel_hold = '2s'", "routes[0].cancel_hold: only applies to an MCP route"),
]


@pytest.mark.parametrize(("text", "expected"), REFUSED)
def test_invalid_values_are_refused_naming_the_key(load: Any, text: str, expected: str) -> None:
    """Each validation rule refuses a bad value with a message naming its dotted key."""
    message = refusal(load, text)
    assert expected in message, message
    assert message.startswith("invalid configuration in ")


@pytest.mark.parametrize("prefix", [*GATEWAY_PATHS, "/admin/x", "/metrics/x", "/operations/"])
def test_prefixes_may_not_overlap_gateway_paths(load: Any, prefix: str) -> None:
    """A route prefix equal to or nested with one of the gateway's own paths is refused."""
    text = f"[[routes]]\nname = 't'\nprefix = '{prefix}'\nupstream = 'http://h'"
    assert "routes[0].prefix:" in refusal(load, text)
    assert "overlaps the gateway's own path" in refusal(load, text)


@pytest.mark.parametrize("prefix", ["/metricsfoo", "/op", "/administration", "/health"])
def test_prefixes_overlap_only_at_segment_boundaries(load: Any, prefix: str) -> None:
    """Sharing characters but not a whole segment with a gateway path is fine."""
    text = f"[[routes]]\nname = 't'\nprefix = '{prefix}'\nupstream = 'http://h'"
    assert load(text).routes[0].prefix == prefix


def test_gateway_paths_constant() -> None:
    """GATEWAY_PATHS lists exactly the gateway's own paths in docs/contract.md."""
    assert set(GATEWAY_PATHS) == {
        "/operations",
        "/admin",
        "/healthz",
        "/readyz",
        "/metrics",
        "/openapi.json",
    }


@pytest.mark.parametrize(
    ("text", "key"),
    [
        (
            "[server]\nprot = 1",
            "server.prot: unknown key "
            "(known keys: client_timeout, host, loop, max_header_size, max_headers, max_relay, "
            "max_spool_total, port, spool_dir, trusted_proxies, workers, write_timeout)",
        ),
        ("[srever]\nport = 1", "srever: unknown key"),
        (ROUTE + "timout = '1s'", "routes[0].timout: unknown key"),
        (
            ROUTE + PROBE + "\nmethd = 'GET'",
            "routes[0].probe.methd: unknown key",
        ),
        (
            "[[clients]]\nname = 'a'\ntoken = 'x'\ntoken_sha256 = ['" + DIGEST_A + "']",
            "clients[0].token: unknown key",
        ),
    ],
)
def test_unknown_keys_are_refused_naming_them(load: Any, text: str, key: str) -> None:
    """A key the config does not know is an error that names it (typos do not pass)."""
    assert key in refusal(load, text)


def test_unknown_env_section_is_refused(load: Any) -> None:
    """An env var for a section that does not exist is refused, naming the var."""
    message = refusal(load, "", environ={"IDEMPOTENCY_GATEWAY_SERVR__PORT": "1"})
    assert "servr: unknown key" in message
    assert "IDEMPOTENCY_GATEWAY_SERVR__PORT" in message


def test_testing_section_is_refused_in_the_file(load: Any) -> None:
    """The fault-injection hook cannot be armed from a config file."""
    assert "testing:" in refusal(load, "[testing]\nfault = 'crash_after_claim'")


def test_testing_fault_comes_from_the_environment(load: Any) -> None:
    """IDEMPOTENCY_GATEWAY_TESTING__FAULT arms a test-only fault."""
    settings = load("", environ={"IDEMPOTENCY_GATEWAY_TESTING__FAULT": "crash_after_claim"})
    assert settings.testing.fault == "crash_after_claim"


# -- normalization -------------------------------------------------------------------


def test_route_values_are_normalized(load: Any) -> None:
    """Methods upper-case, trailing slashes go, redactions lower-case with set-cookie kept."""
    text = """
[[routes]]
name = "t"
prefix = "/tickets/"
upstream = "HTTPS://Example.com:8443/api/"
methods = ["post", "Put", "POST"]
redact_response_headers = ["X-Secret"]
"""
    route = load(text).routes[0]
    assert route.prefix == "/tickets"
    assert route.upstream == "https://Example.com:8443/api"
    assert route.methods == ("POST", "PUT")
    assert route.redact_response_headers == ("set-cookie", "x-secret")


def test_client_digests_are_lower_cased(load: Any) -> None:
    """Token digests are stored lower-case, whatever case the file uses."""
    text = f"[[clients]]\nname = 'agent-a'\ntoken_sha256 = ['{DIGEST_A.upper()}', '{DIGEST_B}']"
    assert load(text).clients[0].token_sha256 == (DIGEST_A, DIGEST_B)


def test_settings_are_frozen() -> None:
    """Settings cannot be changed after validation."""
    settings = Settings()
    with pytest.raises(ValidationError):
        settings.server.port = 1  # type: ignore[misc]


# -- ${VAR} expansion -----------------------------------------------------------------


def test_env_references_in_headers_are_expanded(load: Any) -> None:
    """${VAR} in upstream and probe header values is replaced from the environment."""
    text = (
        ROUTE
        + '[routes.upstream_headers]\nAuthorization = "Bearer ${TICKETS_API_TOKEN}"\n'
        + PROBE
        + "\n"
        + '[routes.probe.headers]\nX-Probe = "${A}-${B}"\n'
    )
    env = {"TICKETS_API_TOKEN": "t0k", "A": "1", "B": "2"}
    route = load(text, environ=env).routes[0]
    assert route.upstream_headers == {"Authorization": "Bearer t0k"}
    assert route.probe.headers == {"X-Probe": "1-2"}


def test_missing_env_reference_is_refused(load: Any) -> None:
    """A ${VAR} whose variable is not set is refused, naming the key and the variable."""
    text = ROUTE + '[routes.upstream_headers]\nAuthorization = "Bearer ${TICKETS_API_TOKEN}"\n'
    message = refusal(load, text)
    assert "routes[0].upstream_headers.Authorization:" in message
    assert "TICKETS_API_TOKEN is not set" in message
    probe = ROUTE + PROBE + "\n[routes.probe.headers]\nX = '${NOPE}'\n"
    assert "routes[0].probe.headers.X: environment variable NOPE is not set" in refusal(load, probe)


def test_expanded_secrets_never_appear_in_errors(load: Any) -> None:
    """An invalid expanded header value is reported without its (secret) value."""
    text = ROUTE + '[routes.upstream_headers]\nAuthorization = "${T}"\n'
    message = refusal(load, text, environ={"T": "s3cret\r\nX: y"})
    assert "routes[0].upstream_headers.Authorization: the value contains CR, LF or NUL" in message
    assert "s3cret" not in message


# -- SQLite URLs --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "path"),
    [
        ("sqlite:///./data/gateway.db", Path("./data/gateway.db")),
        ("sqlite:///relative/path.db", Path("relative/path.db")),
        ("sqlite:////absolute/path.db", Path("/absolute/path.db")),
        ("postgresql://gw@db:5432/gw", None),
        ("postgres://gw@db/gw", None),
    ],
)
def test_store_url_forms(url: str, path: Path | None) -> None:
    """sqlite:/// is relative to the current directory, sqlite://// absolute; PG has no path."""
    store = StoreSettings(url=url)
    assert store.sqlite_path == path
    assert store.is_postgres is (path is None)
    if path is not None:
        assert store.sqlite_path is not None
        assert store.sqlite_path.is_absolute() is url.startswith("sqlite:////")


# -- render_effective --------------------------------------------------------------

FULL = f"""
[server]
host = "0.0.0.0"
port = 9000

[store]
url = "sqlite:////var/lib/gw.db"
busy_timeout = "1500ms"

[idempotency]
scope_headers = ["X-Api-Key"]
retention = "2h"
tombstone_retention = "7d"
lease = "45s"
max_wait = "0"
sweep_interval = "90s"

[admin]
host = "127.0.0.1"
port = 9090

[[clients]]
name = "agent-a"
token_sha256 = ["{DIGEST_A}", "{DIGEST_B}"]

[logging]
level = "warning"
format = "text"

[[routes]]
name = "tickets"
prefix = "/tickets"
upstream = "https://tickets.example:8443/api"
methods = ["POST"]
require_key = false
timeout = "2m"
keepalive = "0"
max_body = "64KiB"
max_stored_response = 1000
max_concurrency = 3
forward_key = "operation_id"
release_statuses = [429, 503]
redact_response_headers = ["X-Token"]
tls_ca = "/etc/ca.pem"
tls_client_cert = "/etc/cert.pem"
tls_client_key = "/etc/key.pem"

[routes.probe]
method = "HEAD"
path = "/v1/issues/{{operation_id}}"
applied_statuses = [200, 204]
not_applied_statuses = [404, 410]
not_applied_after = "10m"

[[routes]]
name = "mail"
prefix = "/mail"
upstream = "http://127.0.0.1:9001"
forward_key = false
"""


def test_render_round_trips(load: Any, tmp_path: Path) -> None:
    """The rendered config parses with tomllib and loads back to equal settings."""
    settings = load(FULL)
    text = render_effective(settings)
    tomllib.loads(text)
    rendered = tmp_path / "rendered.toml"
    rendered.write_text(text)
    assert load_settings(rendered, environ={}) == settings


def test_render_round_trips_defaults_and_example(tmp_path: Path) -> None:
    """Defaults and the example file survive a render and reload unchanged."""
    for settings in (Settings(), load_settings(EXAMPLE, environ={})):
        rendered = tmp_path / "rendered.toml"
        rendered.write_text(render_effective(settings))
        assert load_settings(rendered, environ={}) == settings


def test_render_uses_human_units(load: Any) -> None:
    """Durations and sizes are rendered in their shortest exact human form."""
    data = tomllib.loads(render_effective(load(FULL)))
    assert data["store"]["busy_timeout"] == "1500ms"
    assert data["idempotency"]["tombstone_retention"] == "7d"
    assert data["routes"][0]["timeout"] == "2m"
    assert data["routes"][0]["max_body"] == "64KiB"
    assert data["routes"][0]["max_stored_response"] == "1000B"
    assert data["routes"][0]["probe"]["not_applied_after"] == "10m"


def test_render_masks_secrets(load: Any) -> None:
    """Admin token, header values and URL passwords are shown as ***."""
    text = (
        ROUTE.replace("/tickets", "/t")
        + '[routes.upstream_headers]\nAuthorization = "Bearer ${TOKEN}"\n'
        + PROBE
        + "\n[routes.probe.headers]\nX-Key = 'probe-secret'\n"
    )
    settings = load(
        text,
        environ={
            "TOKEN": "upstream-secret",
            "IDEMPOTENCY_GATEWAY_ADMIN__TOKEN": "admin-secret-0123456789abcdef",
        },
        overrides={"store.url": "postgresql://gw:db-secret@db:5432/gw"},
    )
    rendered = render_effective(settings)
    for secret in ("upstream-secret", "probe-secret", "admin-secret", "db-secret"):
        assert secret not in rendered
    data = tomllib.loads(rendered)
    assert data["admin"]["token"] == "***"
    assert data["routes"][0]["upstream_headers"] == {"Authorization": "***"}
    assert data["routes"][0]["probe"]["headers"] == {"X-Key": "***"}
    assert data["store"]["url"] == "postgresql://gw:***@db:5432/gw"


def test_render_shows_an_armed_fault_as_a_comment(load: Any) -> None:
    """An armed test fault is visible in the rendering but is not a loadable key."""
    settings = load("", environ={"IDEMPOTENCY_GATEWAY_TESTING__FAULT": "crash_after_claim"})
    rendered = render_effective(settings)
    assert "# testing.fault" in rendered
    assert "crash_after_claim" in rendered
    assert "testing" not in tomllib.loads(rendered)


def test_render_escapes_strings(load: Any) -> None:
    """Strings with quotes, backslashes and control characters stay valid TOML."""
    text = (
        ROUTE
        + "[routes.probe]\npath = '/x/{forwarded_key}?q=\"a\\\\b\"'\nsees_all_callers = true\n"
    )
    settings = load(text)
    data = tomllib.loads(render_effective(settings))
    assert data["routes"][0]["probe"]["path"] == settings.routes[0].probe.path


def test_workers_is_a_count_or_auto(load: Any) -> None:
    """`workers = "auto"` is one per CPU this process may use; the environment can set it;
    anything but a count from 1 to 256 or "auto" is refused, naming the key."""
    assert load('[server]\nworkers = "auto"').server.workers == len(os.sched_getaffinity(0))
    assert load("[server]\nworkers = 3").server.workers == 3
    environ = {"IDEMPOTENCY_GATEWAY_SERVER__WORKERS": "2"}
    assert load("", environ=environ).server.workers == 2
    assert load("").server.workers == 1
    for text in ("workers = 0", "workers = 257", 'workers = "many"', "workers = -1"):
        assert "server.workers" in refusal(load, f"[server]\n{text}"), text
    assert '"auto"' in refusal(load, '[server]\nworkers = "many"')


# -- MCP probes ------------------------------------------------------------------

MCP_ROUTE = """
[[routes]]
name = "tools"
kind = "mcp"
prefix = "/mcp"
upstream = "http://127.0.0.1:9100/mcp"
"""
MCP_PROBE = """[routes.probe]
tool = "find_ticket"
arguments = { idempotency_key = "{forwarded_key}" }
applied_pointer = "/found"
sees_all_callers = true
"""


def test_an_mcp_probe_names_a_tool_its_arguments_and_a_pointer(load: Any) -> None:
    """An MCP route's probe takes tool, arguments (nested JSON, placeholders in any
    string), applied_pointer, not_applied_after (default 5m) and headers."""
    text = (
        MCP_ROUTE
        + MCP_PROBE.replace(
            'arguments = { idempotency_key = "{forwarded_key}" }',
            'arguments = { filter = { refs = ["ref-{forwarded_key}"], n = 2, all = true } }',
        ).replace('"/found"', '"/matches/0/a~1b"')
        + 'not_applied_after = "90s"\n[routes.probe.headers]\nX-Probe = "p"\n'
    )
    probe = load(text).routes[0].probe
    assert probe is not None
    assert probe.tool == "find_ticket"
    assert probe.arguments == {"filter": {"refs": ["ref-{forwarded_key}"], "n": 2, "all": True}}
    assert (probe.applied_pointer, probe.not_applied_after) == ("/matches/0/a~1b", 90.0)
    assert probe.headers == {"X-Probe": "p"}
    assert load(MCP_ROUTE + MCP_PROBE).routes[0].probe.not_applied_after == 300.0


MCP_PROBE_REFUSED = [
    (
        MCP_ROUTE + MCP_PROBE.replace('tool = "find_ticket"\n', ""),
        "routes[0].probe.tool: required key is missing",
    ),
    (
        MCP_ROUTE + MCP_PROBE.replace('applied_pointer = "/found"\n', ""),
        "routes[0].probe.applied_pointer: required key is missing",
    ),
    (
        MCP_ROUTE + MCP_PROBE.replace('"/found"', '"found"'),
        "routes[0].probe.applied_pointer: not a JSON pointer (RFC 6901): "
        "Location must start with /",
    ),
    (
        MCP_ROUTE + MCP_PROBE.replace('"/found"', '"/a~2b"'),
        "routes[0].probe.applied_pointer: not a JSON pointer (RFC 6901): Found invalid escape ~2",
    ),
    (
        MCP_ROUTE + MCP_PROBE.replace('"/found"', '""'),
        "routes[0].probe.applied_pointer: '' points at the whole structuredContent",
    ),
    (MCP_ROUTE + MCP_PROBE + "path = '/x/{forwarded_key}'", "routes[0].probe.path: only applies"),
    (MCP_ROUTE + MCP_PROBE + "method = 'POST'", "routes[0].probe.method: only applies to an HTTP"),
    (
        MCP_ROUTE + MCP_PROBE + "applied_statuses = [201]",
        "routes[0].probe.applied_statuses: only applies to an HTTP route's probe",
    ),
    (
        MCP_ROUTE + MCP_PROBE + "not_applied_statuses = [410]",
        "routes[0].probe.not_applied_statuses: only applies to an HTTP route's probe",
    ),
    (
        ROUTE + PROBE + "\ntool = 'find_ticket'",
        'routes[0].probe.tool: only applies to an MCP route\'s probe (kind = "mcp")',
    ),
    (
        ROUTE + PROBE + "\napplied_pointer = '/found'",
        "routes[0].probe.applied_pointer: only applies to an MCP route's probe",
    ),
    (
        ROUTE + PROBE + "\narguments = { a = '{forwarded_key}' }",
        "routes[0].probe.arguments: only applies to an MCP route's probe",
    ),
    (ROUTE + "[routes.probe]\nmethod = 'GET'", "routes[0].probe.path: required key is missing"),
    (
        MCP_ROUTE + MCP_PROBE.replace("{forwarded_key}", "T-1"),
        'routes[0].probe.arguments: names no effect: route "tools"\'s probe',
    ),
    (
        MCP_ROUTE + MCP_PROBE.replace("{forwarded_key}", "{id}"),
        "routes[0].probe.arguments.idempotency_key: unknown placeholder {id}",
    ),
    (
        MCP_ROUTE + "forward_key = 'scoped'\n" + MCP_PROBE.replace("forwarded_key", "operation_id"),
        'routes[0].probe.arguments: {operation_id} needs forward_key = "operation_id"',
    ),
    (
        MCP_ROUTE + MCP_PROBE.replace("forwarded_key", "key"),
        'routes[0].probe.arguments: {key} needs forward_key = "key"',
    ),
    (
        MCP_ROUTE + "forward_key = false\n" + MCP_PROBE,
        'routes[0].probe.arguments: route "tools" has forward_key = false',
    ),
    (
        MCP_ROUTE + "derive_key = 'arguments'\nforward_key = 'scoped'\n" + MCP_PROBE,
        'routes[0].forward_key: route "tools" derives keys and has a probe',
    ),
    (
        MCP_ROUTE + "status_tool = 'find_ticket'\nprotect_tools = ['create_ticket']\n" + MCP_PROBE,
        "routes[0].probe.tool: is the gateway's status tool",
    ),
    (
        MCP_ROUTE + MCP_PROBE + "[routes.probe.headers]\nMcp-Session-Id = 's'\n",
        "routes[0].probe.headers.Mcp-Session-Id: the probe sets this header itself",
    ),
    (
        MCP_ROUTE + MCP_PROBE.replace('"{forwarded_key}"', "1979-05-27"),
        "routes[0].probe.arguments.idempotency_key: date values (TOML dates and times)",
    ),
    (
        MCP_ROUTE + MCP_PROBE.replace('"find_ticket"', '"find ticket"'),
        "routes[0].probe.tool: invalid tool name",
    ),
]


@pytest.mark.parametrize(("text", "expected"), MCP_PROBE_REFUSED)
def test_a_bad_mcp_probe_is_refused_naming_the_key(load: Any, text: str, expected: str) -> None:
    """Each rule of an MCP route's probe (and HTTP probe keys on one, MCP probe keys on an
    HTTP route) refuses the start with a message naming the dotted key."""
    message = refusal(load, text)
    assert expected in message, message
    assert message.startswith("invalid configuration in ")


def test_an_mcp_probe_on_a_derived_key_route_needs_the_operation_id(load: Any) -> None:
    """A derived-key call forwards the operation id: with forward_key = "operation_id"
    (the default) keyed and derived calls forward the same kind of value, so the probe
    may run there."""
    route = load(MCP_ROUTE + "derive_key = 'arguments'\n" + MCP_PROBE).routes[0]
    assert (route.derive_key, route.forward_key) == ("arguments", "operation_id")


def test_an_mcp_probe_renders_and_loads_back(load: Any, tmp_path: Path) -> None:
    """check-config's rendering of an MCP probe masks its header values like an HTTP
    probe's, and loads back to the same settings (the HTTP keys it shows at their
    defaults are not refused)."""
    text = MCP_ROUTE + MCP_PROBE + "[routes.probe.headers]\nX-Key = 'probe-secret'\n"
    settings = load(text)
    rendered = render_effective(settings)
    assert "probe-secret" not in rendered
    data = tomllib.loads(rendered)
    assert data["routes"][0]["probe"]["arguments"] == {"idempotency_key": "{forwarded_key}"}
    assert data["routes"][0]["probe"]["headers"] == {"X-Key": "***"}
    plain = load(MCP_ROUTE + MCP_PROBE)
    (tmp_path / "plain.toml").write_text(render_effective(plain))
    assert load_settings(tmp_path / "plain.toml", environ={}) == plain


def test_the_example_shows_every_mcp_probe_key() -> None:
    """The MCP route of config/gateway.toml sets every MCP probe key."""
    text = EXAMPLE.read_text()
    mcp_part = text[text.index('kind = "mcp"') :]
    for key in ("tool", "arguments", "applied_pointer", "not_applied_after"):
        assert f"{key} =" in mcp_part, key


def test_the_effective_config_shows_no_mcp_keys_on_an_http_route() -> None:
    """check-config prints an HTTP route without the MCP-only keys (their defaults would
    read as settings of the route); an MCP route keeps them, and both parse back."""
    settings = Settings.model_validate(
        {
            "routes": [
                {"name": "tickets", "prefix": "/tickets", "upstream": "http://127.0.0.1:9000"},
                {
                    "name": "tools",
                    "prefix": "/mcp",
                    "upstream": "http://127.0.0.1:9100/mcp",
                    "kind": "mcp",
                },
                {"name": "fs", "prefix": "/fs", "kind": "mcp", "command": ["fs-server"]},
            ]
        }
    )
    text = render_effective(settings)
    http_part, mcp_part, stdio_part = text.split("[[routes]]")[1:4]
    for key in MCP_ONLY:
        assert f"\n{key} =" not in http_part, key
        stdio_key = key in ("command", *STDIO_ONLY)
        assert (f"\n{key} =" in mcp_part) is not stdio_key or key == "status_tool", key
        assert f"\n{key} =" in stdio_part or key in ("status_tool", "run_as"), key
    # A stdio route has no upstream URL to show: its requests go to its children.
    assert "\nupstream =" not in stdio_part
    assert Settings.model_validate(tomllib.loads(text.replace('"***"', '""'))) == settings
