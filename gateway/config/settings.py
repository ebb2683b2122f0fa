"""The whole configuration and the checks that span its sections.

A gateway that starts with a wrong setting loses or duplicates effects
quietly, so every value is checked at start, by pydantic validators that
explain what is wrong in terms of the key (`routes[0].timeout`). The result is
a tree of frozen models passed down explicitly; nothing outside the config
package reads `os.environ` (test-only fault injection comes through
`Settings.testing` like everything else).

The sections are defined in `gateway.config.sections` and
`gateway.config.routes`; this module adds what only the whole can tell: two
routes with one name or prefix, a route over the gateway's own paths, a
client list naming nobody, a caller's key forwarded to an upstream two scopes
reach.
"""

from __future__ import annotations

import hashlib
import ipaddress
import shutil
import socket
from typing import TYPE_CHECKING, Self
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, model_validator

from gateway.config.fields import _SETTINGS_MODEL, _Loc, _Problems
from gateway.config.routes import RouteSettings
from gateway.config.sections import (
    AdminSettings,
    ClientSettings,
    IdempotencySettings,
    LoggingSettings,
    MetricsSettings,
    QuotaSettings,
    ServerSettings,
    StoreSettings,
    TestingSettings,
)
from gateway.engine.scopes import ANONYMOUS_SCOPE

if TYPE_CHECKING:
    from collections.abc import Iterator

GATEWAY_PATHS: tuple[str, ...] = (
    "/operations",
    "/admin",
    "/healthz",
    "/readyz",
    "/metrics",
    "/openapi.json",
)
"""The gateway's own paths; no route prefix may equal or nest with one of them."""


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
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    testing: TestingSettings = Field(default_factory=TestingSettings)

    @model_validator(mode="after")
    def _check_across(self) -> Self:
        problems = [
            *self._client_problems(),
            *self._route_problems(),
            *self._route_client_problems(),
            *self._bare_key_problems(),
            *self._listener_problems(),
            *self._probe_principal_problems(),
        ]
        if problems:
            raise _Problems(*problems)
        return self

    def _probe_principal_problems(self) -> Iterator[tuple[_Loc, str]]:
        """A probe on a route that passes callers' own credentials upstream asks as the
        route, not as the caller: an upstream that shows each account only its own
        records answers "not found" about an effect that exists, and the key would be
        released into a second effect. Refused unless the probe says it sees everyone."""
        for i, route in enumerate(self.routes):
            forwarded = self.forwarded_credentials(route)
            if route.probe is None or route.probe.sees_all_callers or not forwarded:
                continue
            yield (
                ("routes", i, "probe", "sees_all_callers"),
                f'route "{route.name}" passes each caller\'s own {", ".join(forwarded)} '
                "upstream, but its probe asks with the route's headers only: where the "
                'upstream shows each caller only its own records, the probe reads "not '
                'found" about effects that exist. Set sees_all_callers = true only if the '
                "probe's credentials see every caller's effects; otherwise set the header in "
                "upstream_headers (one principal for calls and probe), or remove the probe",
            )

    def forwarded_credentials(self, route: RouteSettings) -> tuple[str, ...]:
        """The scope headers `route` passes on upstream as each caller sent them: with
        HMAC scopes (no `[[clients]]`), those its `upstream_headers` do not replace."""
        if self.clients:
            return ()
        replaced = {name.lower() for name in route.upstream_headers}
        return tuple(
            name for name in self.idempotency.scope_headers if name.lower() not in replaced
        )

    def warnings(self) -> tuple[str, ...]:
        """What serves but may not do what the operator meant (check-config prints them,
        `serve` logs them at start)."""
        blind = (
            f'route "{route.name}": its probe has no applies_to, so its "not found" never '
            'releases a key (only its "found" settles); list the requests it can see, '
            'e.g. applies_to = ["POST /v1/issues"]'
            for route in self.routes
            if route.probe is not None and not route.probe.applies_to
        )
        # A stdio server is started at the first call: a wrong program shows here first.
        missing = (
            f'route "{route.name}": its command {route.command[0]!r} is not an executable '
            "file nor found on PATH; every call will be refused until it is"
            for route in self.routes
            if route.command is not None and shutil.which(route.command[0]) is None
        )
        return (*blind, *missing)

    def _listener_problems(self) -> Iterator[tuple[_Loc, str]]:
        port = self.admin.port
        if self.admin.enabled and port != 0 and port == self.server.port:
            yield (
                ("admin", "port"),
                f"is the main listener's port {port}; the admin API needs a port of its "
                "own, so that no path to it runs through the main listener",
            )
        if self.metrics.listener != "main" and not self.admin.enabled:
            yield (
                ("metrics", "listener"),
                f"is {self.metrics.listener!r}, but there is no admin listener: set "
                '[admin] token, or serve /metrics on the main listener ("main")',
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
        yield from self._admin_token_problems(owners)

    def _admin_token_problems(self, clients: dict[str, int]) -> Iterator[tuple[_Loc, str]]:
        """A digest names one holder: a client's token that is also an admin's would make
        every call of that client an operator's, and two admins' one would merge them."""
        admins: dict[str, int] = {}
        shared = self.admin.token.get_secret_value()
        if shared:
            admins[hashlib.sha256(shared.encode()).hexdigest()] = -1
        for i, token in enumerate(self.admin.tokens):
            digest = token.token_sha256
            if digest in clients:
                also = f"clients[{clients[digest]}]"
            elif digest in admins:
                also = "[admin] token" if admins[digest] < 0 else f"admin.tokens[{admins[digest]}]"
            else:
                admins[digest] = i
                continue
            yield (
                ("admin", "tokens", i, "token_sha256"),
                f"this digest also belongs to {also}; a token must identify one holder",
            )
        if shared:
            digest = hashlib.sha256(shared.encode()).hexdigest()
            if digest in clients:
                yield (
                    ("admin", "token"),
                    f"is also the token of clients[{clients[digest]}]; a token must identify "
                    "one holder",
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
        endpoints: dict[str, frozenset[tuple[str, int]]] = {}

        def reached(url: str) -> frozenset[tuple[str, int]]:
            if url not in endpoints:
                endpoints[url] = upstream_endpoints(url)
            return endpoints[url]

        for i, route in enumerate(self.routes):
            if route.forward_key != "key":
                continue
            origin = _origin(route.upstream)
            mine = reached(route.upstream)
            siblings = [other for other in self.routes if reached(other.upstream) & mine]
            reach = {self.scopes_reaching(other) for other in siblings}
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

    def scopes_reaching(self, route: RouteSettings) -> frozenset[str]:
        """The scopes that can use a route; an open set (HMAC scopes) as the empty set."""
        if self.clients:
            names = route.clients if route.clients is not None else self.clients_names
            return frozenset(names)
        if not self.idempotency.scope_headers:
            return frozenset({ANONYMOUS_SCOPE})  # shared_scope: everyone is one scope
        return frozenset()

    @property
    def tenant_routes(self) -> frozenset[str]:
        """Routes that two or more `[[clients]]` may use: tenants by configuration, whose
        share of the route's slots is kept whoever came first (`gateway.engine.fairness`)."""
        return frozenset(
            route.name for route in self.routes if len(self.scopes_reaching(route)) >= 2
        )

    @property
    def clients_names(self) -> tuple[str, ...]:
        return tuple(client.name for client in self.clients)


def _origin(url: str) -> str:
    """`scheme://host:port`, the port made explicit and the host canonical, to name it."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.scheme}://{canonical_host(parts.hostname or '')}:{port}"


def canonical_host(host: str) -> str:
    """One spelling per host: lower case, no trailing dot, an IPv4 address in dotted quads
    whatever its numeric spelling (`127.1`, `2130706433`, `0x7f000001`) or IPv4-mapped
    IPv6 form, an IPv6 address compressed.

    >>> [canonical_host(h) for h in ("LocalHost.", "127.1", "2130706433", "0x7f000001")]
    ['localhost', '127.0.0.1', '127.0.0.1', '127.0.0.1']
    >>> canonical_host("::ffff:127.0.0.1"), canonical_host("0:0::1")
    ('127.0.0.1', '::1')
    """
    host = host.lower().rstrip(".")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        try:  # the spellings C's inet_aton takes, as an HTTP client's resolver does
            return socket.inet_ntoa(socket.inet_aton(host))
        except OSError:
            return host
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


def upstream_endpoints(url: str) -> frozenset[tuple[str, int]]:
    """The (address, port) pairs an upstream URL reaches, resolved now (at start): two
    routes whose upstreams share one are one origin to the tool, however spelled
    (`127.0.0.1` and `localhost`). A name that does not resolve stands for itself."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = canonical_host(parts.hostname or "")
    found = {(host, port)}
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return frozenset(found)
    found.update((canonical_host(str(info[4][0])), port) for info in infos)
    return frozenset(found)


def _paths_overlap(a: str, b: str) -> bool:
    """Equal, or one is a whole-segment prefix of the other (`/metrics/x`, not `/metricsx`)."""
    return a == b or a.startswith(b + "/") or b.startswith(a + "/")
