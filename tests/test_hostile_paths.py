"""No open proxy: hostile request targets never reach anything but the configured upstream.

Requests go over raw sockets, because aiohttp's client would normalise the
very paths these tests are about. After every request the gateway must still
answer /healthz, and a refused request must leave no upstream effect and no
operation record.

What the gateway does with each kind of target (pinned below):

- dot segments (also `%2e`), empty segments (`//`) and encoded slashes or
  backslashes (`%2f`, `%5c`): 400 `invalid-request`, for every method;
- absolute-form targets (`POST http://169.254.169.254/tickets/v1/issues`): the
  authority is ignored and the path is routed like an origin-form path, so
  the request goes to the configured upstream and nowhere else (a path that
  matches no route is 404 `no-route`); authority-form targets are refused by
  the HTTP parser (400);
- `Host` never selects the destination: it only appears, as `host=`, in the
  `Forwarded` header the upstream receives; two `Host` headers are a parser 400;
- `CONNECT` and `OPTIONS *`: 4xx, no tunnel, nothing forwarded;
- an upstream's redirect is passed back as it came and never followed.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import pytest
import pytest_asyncio
from harness import RunningGateway
from hostile import (
    ConnectionCounter,
    assert_healthy,
    assert_no_record,
    problem_type,
    record_count,
)
from rawhttp import RawResponse, address_of, exchange, request
from upstream import CountingUpstream

BODY = b'{"title": "hostile"}'


@pytest_asyncio.fixture
async def elsewhere() -> AsyncIterator[ConnectionCounter]:
    """A listener standing for every host the gateway must never contact."""
    async with ConnectionCounter() as counter:
        yield counter


async def send(
    gateway: RunningGateway,
    method: str,
    target: str,
    key: str | None = None,
    *,
    host: str | None = "gateway.test",
    headers: list[tuple[str, str]] | None = None,
) -> RawResponse:
    sent = list(headers or [])
    if key is not None:
        sent.append(("Idempotency-Key", key))
    sent.append(("Content-Type", "application/json"))
    body = BODY if method in ("POST", "PATCH") else b""
    return await exchange(address_of(gateway.url), request(method, target, sent, body, host=host))


async def assert_refused(
    gateway: RunningGateway,
    upstream: CountingUpstream,
    response: RawResponse,
    key: str | None,
    *,
    effects: int = 0,
) -> None:
    """A 4xx, the gateway still healthy, the upstream untouched, and no record for the key."""
    assert response.status is not None, "the gateway hung up instead of answering"
    assert 400 <= response.status < 500, (response.status, response.body[:300])
    await assert_healthy(gateway)
    assert upstream.count == effects
    if key is not None:
        await assert_no_record(gateway, key)
    assert await record_count(gateway) == 0


async def assert_went_upstream(
    gateway: RunningGateway, upstream: CountingUpstream, response: RawResponse, key: str
) -> None:
    """Answered by the configured upstream (one effect on /v1/issues) and recorded as completed."""
    assert response.status == 201, (response.status, response.body[:300])
    await assert_healthy(gateway)
    assert upstream.count == 1
    effect = upstream.effects[0]
    assert (effect.method, effect.path) == ("POST", "/v1/issues")
    assert effect.headers["host"] == urlsplit(upstream.url).netloc
    lookup = await exchange(address_of(gateway.url), request("GET", f"/operations/{key}"))
    assert lookup.status == 200
    assert lookup.header("idempotency-status") == "completed"
    assert json.loads(lookup.body)["id"] == effect.key  # the effect is this key's operation


REFUSED_PATHS = [
    pytest.param("/tickets/../admin/operations", id="dot-dot"),
    pytest.param("/tickets/v1/..", id="trailing-dot-dot"),
    pytest.param("/tickets/v1/../../healthz", id="dot-dot-climbing-out"),
    pytest.param("/tickets/%2e%2e/v1/issues", id="encoded-dot-dot"),
    pytest.param("/tickets/v1/%2E%2e/issues", id="mixed-case-encoded-dot-dot"),
    pytest.param("/tickets/.%2E/v1/issues", id="half-encoded-dot-dot"),
    pytest.param("/tickets/./v1/issues", id="dot"),
    pytest.param("/tickets/v1/%2e/issues", id="encoded-dot"),
    pytest.param("/tickets//v1/issues", id="double-slash"),
    pytest.param("//tickets/v1/issues", id="leading-double-slash"),
    pytest.param("/tickets/v1/issues//", id="trailing-double-slash"),
    pytest.param("/tickets/v1%2fissues", id="encoded-slash"),
    pytest.param("/tickets/v1%2F..%2Fadmin", id="encoded-slash-upper"),
    pytest.param("/tickets/v1%5cissues", id="encoded-backslash"),
    pytest.param("/tickets/v1%5C..%5Cadmin", id="encoded-backslash-upper"),
    pytest.param("/tickets/%2e%2e%2f%2e%2e%2fadmin", id="encoded-traversal"),
    pytest.param("http://169.254.169.254/tickets/../admin", id="absolute-form-dot-dot"),
    # Fixed (gateway/proxy/routing.py check_path): a raw backslash passes (`%5c` is refused),
    # and an upstream that reads `\` as `/` climbs out of the route's base path.
    pytest.param("/tickets/v1\\..\\..\\admin", id="raw-backslash-traversal"),
]


@pytest.mark.parametrize("target", REFUSED_PATHS)
async def test_path_tricks_are_refused_for_every_method(
    gateway: RunningGateway, upstream: CountingUpstream, target: str
) -> None:
    """Dot segments, empty segments and encoded slashes are 400 invalid-request, never forwarded."""
    protected = await send(gateway, "POST", target, "hostile-path")
    assert protected.status == 400, (protected.status, protected.body[:300])
    assert problem_type(protected) == "invalid-request"
    await assert_refused(gateway, upstream, protected, "hostile-path")
    passthrough = await send(gateway, "GET", target, "hostile-path-get")
    assert passthrough.status == 400
    await assert_refused(gateway, upstream, passthrough, "hostile-path-get")


async def test_absolute_form_target_to_metadata_address_goes_to_the_configured_upstream(
    gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    """`POST http://169.254.169.254/tickets/v1/issues` is routed by its path to the upstream."""
    key = "absolute-metadata"
    response = await send(gateway, "POST", "http://169.254.169.254/tickets/v1/issues", key)
    await assert_went_upstream(gateway, upstream, response, key)


@pytest.mark.parametrize("scheme", ["http", "https", "ftp"])
async def test_absolute_form_authority_is_never_contacted(
    gateway: RunningGateway,
    upstream: CountingUpstream,
    elsewhere: ConnectionCounter,
    scheme: str,
) -> None:
    """An absolute-form target naming another host reaches only the configured upstream."""
    key = f"absolute-{scheme}"
    target = f"{scheme}://{elsewhere.authority}/tickets/v1/issues"
    response = await send(gateway, "POST", target, key)
    await assert_went_upstream(gateway, upstream, response, key)
    assert elsewhere.connections == 0


async def test_absolute_form_outside_every_route_is_404(
    gateway: RunningGateway, upstream: CountingUpstream, elsewhere: ConnectionCounter
) -> None:
    """An absolute-form target whose path matches no route is 404 no-route, contacting nobody."""
    for method, key in (("POST", "absolute-no-route"), ("GET", "absolute-no-route-get")):
        target = f"http://{elsewhere.authority}/latest/meta-data"
        response = await send(gateway, method, target, key)
        assert response.status == 404
        assert problem_type(response) == "no-route"
        await assert_refused(gateway, upstream, response, key)
    assert elsewhere.connections == 0


@pytest.mark.parametrize("target", ["169.254.169.254:80", "127.0.0.1:22"], ids=["metadata", "ssh"])
async def test_authority_form_target_is_refused_by_the_parser(
    gateway: RunningGateway, upstream: CountingUpstream, target: str
) -> None:
    """A `host:port` target on a non-CONNECT method is a 400 and goes nowhere."""
    response = await send(gateway, "POST", target, "authority-form")
    assert response.status == 400
    await assert_refused(gateway, upstream, response, "authority-form")


async def test_connect_opens_no_tunnel(
    gateway: RunningGateway, upstream: CountingUpstream, elsewhere: ConnectionCounter
) -> None:
    """`CONNECT host:port` gets a 4xx; the named port is never connected to."""
    for target in ("127.0.0.1:22", elsewhere.authority):
        response = await send(gateway, "CONNECT", target, "connect", host=target)
        await assert_refused(gateway, upstream, response, "connect")
    assert elsewhere.connections == 0


async def test_options_asterisk_is_refused(
    gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    """`OPTIONS * HTTP/1.1` gets a 4xx and nothing is forwarded."""
    response = await send(gateway, "OPTIONS", "*", "options-asterisk")
    await assert_refused(gateway, upstream, response, "options-asterisk")


@pytest.mark.parametrize("host", ["evil.example", "169.254.169.254:80"], ids=["name", "port"])
async def test_host_header_never_selects_the_destination(
    gateway: RunningGateway, upstream: CountingUpstream, host: str
) -> None:
    """A foreign `Host` is forwarded to the configured upstream, which sees its own host."""
    key = f"host-{host}"
    response = await send(gateway, "POST", "/tickets/v1/issues", key, host=host)
    await assert_went_upstream(gateway, upstream, response, key)
    assert f'host="{host}"' in upstream.effects[0].headers["forwarded"]


async def test_host_header_with_the_listeners_port_goes_nowhere_else(
    gateway: RunningGateway, upstream: CountingUpstream, elsewhere: ConnectionCounter
) -> None:
    """A `Host` naming another listener's address does not make the gateway connect to it."""
    key = "host-elsewhere"
    response = await send(gateway, "POST", "/tickets/v1/issues", key, host=elsewhere.authority)
    await assert_went_upstream(gateway, upstream, response, key)
    assert elsewhere.connections == 0


async def test_two_host_headers_are_refused(
    gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    """Two `Host` headers are a 400 from the parser; nothing is recorded or forwarded."""
    response = await send(
        gateway, "POST", "/tickets/v1/issues", "two-hosts", headers=[("Host", "evil.example")]
    )
    assert response.status == 400
    await assert_refused(gateway, upstream, response, "two-hosts")


async def test_missing_host_header_is_refused(
    gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    """An HTTP/1.1 request without `Host` is a 400; nothing is recorded or forwarded."""
    response = await send(gateway, "POST", "/tickets/v1/issues", "no-host", host=None)
    assert response.status == 400
    await assert_refused(gateway, upstream, response, "no-host")


def forwarded_elements(value: str) -> list[dict[str, str]]:
    """Parse an RFC 7239 `Forwarded` value: elements split on `,`, pairs on `;`, quotes kept."""
    elements: list[dict[str, str]] = []
    pairs: dict[str, str] = {}
    name, text, quoted, escaped, in_value = "", "", False, False, False
    for char in value + ",":
        if escaped:
            text, escaped = text + char, False
        elif quoted:
            if char == "\\":
                escaped = True
            elif char == '"':
                quoted = False
            else:
                text += char
        elif char == '"':
            quoted = True
        elif char == "=" and not in_value:
            name, text, in_value = text.strip().lower(), "", True
        elif char in ";,":
            if name:
                pairs[name] = text.strip()
            name, text, in_value = "", "", False
            if char == ",":
                elements.append(pairs)
                pairs = {}
        else:
            text += char
    return elements


# Fixed (gateway/upstream/headers.py forwarded): `host` is put between quotes without escaping,
# so a `Host` with a `"` forges elements and `for=` values in the upstream's `Forwarded`.
@pytest.mark.parametrize(
    "host",
    ['evil";for=6.6.6.6', 'x", for=6.6.6.6;host="y'],
    ids=["forged-for-pair", "forged-element"],
)
async def test_host_header_cannot_forge_forwarded_elements(
    gateway: RunningGateway, upstream: CountingUpstream, host: str
) -> None:
    """A `Host` with quotes is refused or escaped: the upstream sees one hop, from the caller."""
    key = "host-quote"
    response = await send(gateway, "POST", "/tickets/v1/issues", key, host=host)
    assert response.status is not None
    if 400 <= response.status < 500:
        await assert_refused(gateway, upstream, response, key)
        return
    await assert_went_upstream(gateway, upstream, response, key)
    elements = forwarded_elements(upstream.effects[0].headers["forwarded"])
    assert elements == [{"for": "127.0.0.1", "host": host, "proto": "http"}]


@pytest.mark.parametrize(("method", "key"), [("POST", "redirected"), ("GET", None)])
async def test_upstream_redirect_is_passed_back_never_followed(
    gateway: RunningGateway,
    upstream: CountingUpstream,
    elsewhere: ConnectionCounter,
    method: str,
    key: str | None,
) -> None:
    """An upstream 302 reaches the caller with its Location; the gateway never goes there."""
    location = f"http://{elsewhere.authority}/stolen"
    response = await send(gateway, method, f"/tickets/v1/issues?redirect={location}", key)
    assert response.status == 302
    assert response.header("location") == location
    await assert_healthy(gateway)
    assert upstream.count == 1
    assert elsewhere.connections == 0
