"""Inputs that used to name one effect twice, bypass a lock, or crash a store.

Five regressions, each pinned where the defect showed: quoted keys with outer
whitespace, probe paths the upstream cannot answer, the SQLite process lock
taken through a link, `If-Match` versions a store cannot hold, and operator
text a store cannot hold. End-to-end tests run a real gateway on 127.0.0.1
against SQLite and, marked `postgres`, against a fresh PostgreSQL schema.
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web
from conftest import GatewayFactory
from harness import (
    ADMIN_TOKEN,
    ROOT,
    GatewayProcess,
    RunningGateway,
    settings_for,
    spawn,
    write_config,
)
from upstream import CountingUpstream

from gateway.config import Settings, load_settings
from gateway.engine.errors import ConfigError, InvalidKey, StoreUnavailable
from gateway.engine.keys import parse_idempotency_key
from gateway.store.sqlite import SqliteStore

PROBLEM = "application/problem+json"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


# -- shared helpers ------------------------------------------------------------------


@pytest_asyncio.fixture
async def any_store_gateway(
    store_url: str | None, gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> RunningGateway:
    """An in-process gateway with an admin token, on each store (stopped before the schema)."""
    return await gateway_factory(upstream.url, store_url=store_url, admin={"token": ADMIN_TOKEN})


async def problem_type(response: aiohttp.ClientResponse) -> str:
    assert response.content_type == PROBLEM, await response.text()
    document = json.loads(await response.read())
    return str(document["type"]).rsplit("/", 1)[-1]


async def make_unknown(gateway: RunningGateway, key: str) -> dict[str, Any]:
    """The upstream applies the effect and drops the connection: the key is `unknown`."""
    response = await gateway.post("/tickets/v1/issues?drop=after_effect", key=key, json_body={})
    assert response.status == 502
    return await operation(gateway, key)


async def operation(gateway: RunningGateway, key: str) -> dict[str, Any]:
    response = await gateway.get(f"/operations/{key}")
    assert response.status == 200, await response.text()
    document: dict[str, Any] = await response.json()
    document["etag"] = response.headers["ETag"]
    return document


def resolve_paths(key: str, operation_id: str) -> list[tuple[str, dict[str, str]]]:
    """The owner's and the admin's resolve path, each with its credentials."""
    return [
        (f"/operations/{key}/resolve", {}),
        (f"/admin/operations/{operation_id}/resolve", ADMIN),
    ]


async def post_json(
    gateway: RunningGateway, path: str, raw: bytes, headers: dict[str, str] | None = None
) -> aiohttp.ClientResponse:
    """POST raw JSON bytes (so a test controls every escape) to a gateway path."""
    base = gateway.admin_url if path.startswith("/admin/") else gateway.url
    assert base is not None
    response = await gateway.session.post(
        base + path,
        data=raw,
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    await response.read()
    return response


# -- 1. quoted keys with whitespace inside the quotes ---------------------------------


@pytest.mark.parametrize("value", ['"  pay-42 "', '" pay-42"', '"pay-42 "', '"pay 42 "'])
def test_quoted_key_with_outer_whitespace_is_refused(value: str) -> None:
    """A quoted key padded inside its quotes is InvalidKey, since HTTP would strip it (defect 1)."""
    with pytest.raises(InvalidKey, match="whitespace") as caught:
        parse_idempotency_key([value])
    assert "strips" in caught.value.detail
    assert caught.value.problem_type == "invalid-key"


def test_quoted_and_bare_forms_still_name_one_key() -> None:
    """Bare and quoted spellings, and inner spaces, keep meaning one key (defect 1)."""
    assert parse_idempotency_key(['"pay-42"']) == parse_idempotency_key(["pay-42"]) == "pay-42"
    assert parse_idempotency_key(['"pay 42"']) == parse_idempotency_key(["pay 42"]) == "pay 42"


async def test_padded_quoted_key_is_400_and_never_forwarded(
    gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    """`"  pay-42 "` gets 400 invalid-key end to end and reaches no upstream (defect 1)."""
    response = await gateway.post("/tickets/v1/issues", key='"  pay-42 "', json_body={"a": 1})
    assert response.status == 400
    assert await problem_type(response) == "invalid-key"
    assert "whitespace" in (await response.json(content_type=PROBLEM))["detail"]
    assert upstream.count == 0
    for spelling in ("pay-42", "%20%20pay-42%20"):
        assert (await gateway.get(f"/operations/{spelling}")).status == 404


# -- 2. probe paths that name what the upstream saw -----------------------------------


ONE_SCOPE = "[idempotency]\nscope_headers = []\nshared_scope = true\n"
"""Every caller in one scope: where forwarding the caller's key as it came is allowed."""


def route_toml(forward_key: str, probe_path: str | None) -> str:
    text = ONE_SCOPE if forward_key in ("true", '"key"') else ""
    text += (
        '[[routes]]\nname = "billing"\nprefix = "/billing"\n'
        f'upstream = "http://127.0.0.1:9000"\nforward_key = {forward_key}\n'
    )
    if probe_path is not None:
        text += f"[routes.probe]\npath = '{probe_path}'\nsees_all_callers = true\n"
    return text


def load_route_config(tmp_path: Path, text: str) -> Settings:
    path = tmp_path / "gateway.toml"
    path.write_text(text)
    return load_settings(path, environ={})


@pytest.mark.parametrize(
    ("forward_key", "probe_path", "rule"),
    [
        ('"operation_id"', "/v1/issues?client_ref={key}", '{key} needs forward_key = "key"'),
        ('"scoped"', "/v1/issues?client_ref={key}", '{key} needs forward_key = "key"'),
        ('"scoped"', "/v1/issues/{operation_id}", "{operation_id} needs forward_key"),
        ("false", "/v1/issues?client_ref={key}", "forward_key = false"),
        ("false", "/v1/issues/{operation_id}", "forward_key = false"),
        ("false", "/v1/issues/{forwarded_key}", "forward_key = false"),
        ("false", "/v1/issues", "forward_key = false"),
        ("true", "/v1/issues/{operation_id}", '{operation_id} needs forward_key = "operation_id"'),
        ('"key"', "/v1/issues/{operation_id}", '{operation_id} needs forward_key = "operation_id"'),
        ("true", "/v1/issues", "names no effect"),
        ('"operation_id"', "/v1/issues?all=1", "names no effect"),
    ],
)
def test_probe_path_must_name_what_the_route_forwarded(
    tmp_path: Path, forward_key: str, probe_path: str, rule: str
) -> None:
    """A probe path the upstream cannot answer for this forward_key is refused (defect 2)."""
    with pytest.raises(ConfigError) as caught:
        load_route_config(tmp_path, route_toml(forward_key, probe_path))
    message = str(caught.value)
    assert "routes[0].probe.path: " in message, message
    assert 'route "billing"' in message, message
    assert rule in message, message


@pytest.mark.parametrize(
    ("forward_key", "probe_path"),
    [
        ("true", "/v1/issues?client_ref={key}"),
        ("true", "/v1/issues?client_ref={forwarded_key}"),
        ("true", "/v1/issues/{key}?again={forwarded_key}"),
        ('"key"', "/v1/issues?client_ref={key}"),
        ('"scoped"', "/v1/issues?client_ref={forwarded_key}"),
        ('"operation_id"', "/v1/issues/{operation_id}"),
        ('"operation_id"', "/v1/issues/{forwarded_key}"),
        ("false", None),
    ],
)
def test_probe_paths_that_name_the_effect_are_accepted(
    tmp_path: Path, forward_key: str, probe_path: str | None
) -> None:
    """Each placeholder is accepted with the forward_key that sends it upstream (defect 2)."""
    (route,) = load_route_config(tmp_path, route_toml(forward_key, probe_path)).routes
    assert (route.probe.path if route.probe else None) == probe_path


def test_check_config_refuses_a_probe_the_upstream_cannot_answer(tmp_path: Path) -> None:
    """`check-config` exits non-zero naming the route when {key} is never forwarded (defect 2)."""
    config = tmp_path / "gateway.toml"
    config.write_text(route_toml('"operation_id"', "/v1/issues?client_ref={key}"))
    result = subprocess.run(
        [sys.executable, "-m", "gateway", "check-config", "--config", str(config)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0, result.stdout
    assert "routes[0].probe.path" in result.stderr
    assert 'route "billing"' in result.stderr


# -- 3. the SQLite process lock follows the file, by any path --------------------------


def posix_locks_held(path: Path) -> list[str]:
    """This process's POSIX (fcntl) locks on the file at `path`, from /proc/locks."""
    inode = os.stat(path).st_ino
    held = []
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "->" in fields or fields[1] != "POSIX" or int(fields[4]) != os.getpid():
            continue
        if int(fields[5].rsplit(":", 1)[1]) == inode:
            held.append(" ".join(fields[3:]))
    return sorted(held)


@pytest.mark.parametrize("link", ["symlink", "hardlink"])
async def test_a_second_store_through_a_link_is_refused(tmp_path: Path, link: str) -> None:
    """A store opened through a symlink or hard link to a held file is refused (defect 3)."""
    database = tmp_path / "gateway.db"
    first = SqliteStore(path=database, busy_timeout=1.0)
    await first.open()
    try:
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        alias = elsewhere / "alias.db"
        if link == "symlink":
            alias.symlink_to(database)
        else:
            os.link(database, alias)
        sqlite_locks = posix_locks_held(database)
        assert sqlite_locks  # the open WAL connections hold shared locks

        second = SqliteStore(path=alias, busy_timeout=1.0)
        try:
            with pytest.raises(StoreUnavailable) as caught:
                await second.open()
        finally:
            await second.close()
        message = caught.value.detail
        assert str(alias) in message
        assert "SQLite serves one gateway process" in message
        assert "PostgreSQL" in message
        # Refusing must not drop the first store's SQLite locks (closing any
        # descriptor of a file drops the process's POSIX locks on it).
        assert posix_locks_held(database) == sqlite_locks
        await first.ping()
    finally:
        await first.close()

    again = SqliteStore(path=alias, busy_timeout=1.0)
    await again.open()  # the lock went with the first store
    await again.close()


async def test_a_new_database_file_is_private(tmp_path: Path) -> None:
    """The lock creates a missing database file with mode 0600 before SQLite opens it (defect 3)."""
    database = tmp_path / "new" / "gateway.db"
    store = SqliteStore(path=database, busy_timeout=1.0)
    await store.open()
    try:
        assert database.stat().st_mode & 0o777 == 0o600
    finally:
        await store.close()
    assert not database.with_name("gateway.db.lock").exists()


@pytest_asyncio.fixture
async def gated_upstream() -> AsyncIterator[tuple[str, asyncio.Event, asyncio.Event]]:
    """An upstream on 127.0.0.1 that holds each request until `release` is set.

    Yields (url, arrived, release).
    """
    arrived, release = asyncio.Event(), asyncio.Event()

    async def hold(request: web.Request) -> web.Response:
        await request.read()
        arrived.set()
        await release.wait()
        return web.json_response({"id": "T-1"}, status=201)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", hold)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}", arrived, release
    finally:
        release.set()
        await runner.cleanup()


def start_serve(config: Path, log_path: Path) -> subprocess.Popen[str]:
    """`python -m gateway serve` on `config`, stdout piped, stderr to `log_path`."""
    with open(log_path, "w") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--config", str(config)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )


@pytest.mark.slow
async def test_a_second_gateway_through_a_symlink_refuses_to_start(
    processes: list[GatewayProcess],
    tmp_path: Path,
    gated_upstream: tuple[str, asyncio.Event, asyncio.Event],
) -> None:
    """`serve` via a symlink to a served file exits non-zero; in-flight stays (defect 3)."""
    url, arrived, release = gated_upstream
    first = spawn(processes, tmp_path, url)
    alias_dir = tmp_path / "alias"
    alias_dir.mkdir()
    (alias_dir / "gw.db").symlink_to(tmp_path / "gateway.db")
    settings = settings_for(tmp_path, url, store_url=f"sqlite:///{alias_dir / 'gw.db'}")
    config = write_config(settings, tmp_path / "second.toml")

    async with aiohttp.ClientSession() as session:
        sent = asyncio.create_task(
            session.post(
                f"{first.url}/tickets/v1/issues", data=b"{}", headers={"Idempotency-Key": "live-1"}
            )
        )
        await asyncio.wait_for(arrived.wait(), 10)

        second = start_serve(config, tmp_path / "second.log")
        try:
            assert second.stdout is not None
            ready, _, _ = await asyncio.to_thread(select.select, [second.stdout], [], [], 15)
            line = second.stdout.readline() if ready else ""
            async with session.get(f"{first.url}/operations/live-1") as looked_up:
                state = (await looked_up.json())["state"]
            assert state == "in_flight", f"the second gateway changed the live record to {state}"
            assert "listening on" not in line
            assert await asyncio.to_thread(second.wait, 15) != 0
        finally:
            if second.poll() is None:
                second.kill()
                second.wait()
            assert second.stdout is not None
            second.stdout.close()
        assert "in use by another gateway process" in (tmp_path / "second.log").read_text()

        release.set()
        response = await asyncio.wait_for(sent, 10)
        assert response.status == 201
        response.release()
    async with aiohttp.ClientSession() as session, session.get(f"{first.url}/readyz") as ready_:
        assert ready_.status == 200


# -- 4. If-Match versions a store cannot hold ----------------------------------------


@pytest.mark.parametrize(
    "version",
    [
        pytest.param("99999999999999999999", id="20-digits"),
        pytest.param(str(2**63), id="2**63"),
        pytest.param(str(2**63 - 1), id="2**63-1"),
        pytest.param("9" * 5000, id="5000-digits"),
        pytest.param("²", id="superscript-two"),
        pytest.param("CURRENT-ARABIC-INDIC", id="arabic-indic-current"),
        pytest.param("-1", id="negative"),
    ],
)
async def test_if_match_with_an_unholdable_version_is_412(
    any_store_gateway: RunningGateway, upstream: CountingUpstream, version: str
) -> None:
    """An If-Match version out of range or not in ASCII digits is 412, never 500/503 (defect 4)."""
    gateway = any_store_gateway
    before = await make_unknown(gateway, "im-1")
    if version == "CURRENT-ARABIC-INDIC":
        current = before["etag"].strip('"').rsplit(".", 1)[1]
        version = "".join(chr(0x0660 + int(digit)) for digit in current)
    headers = {"If-Match": f'"{before["id"]}.{version}"'}
    raw = json.dumps({"outcome": "not_applied"}).encode()
    for path, credentials in resolve_paths("im-1", before["id"]):
        response = await post_json(gateway, path, raw, {**headers, **credentials})
        assert response.status == 412, await response.text()
        assert await problem_type(response) == "precondition-failed"
    after = await operation(gateway, "im-1")
    assert (after["state"], after["etag"]) == ("unknown", before["etag"])
    assert upstream.count == 1


async def test_if_match_current_etag_still_resolves(
    any_store_gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    """The exact current ETag (and `*`) still passes the stricter If-Match parse (defect 4)."""
    gateway = any_store_gateway
    for key, if_match in (("im-2", None), ("im-3", "*")):
        before = await make_unknown(gateway, key)
        # applied: a not_applied this soon is refused as too early, whatever If-Match says
        raw = json.dumps({"outcome": "applied"}).encode()
        response = await post_json(
            gateway, f"/operations/{key}/resolve", raw, {"If-Match": if_match or before["etag"]}
        )
        assert response.status == 200, await response.text()
        assert (await operation(gateway, key))["state"] == "completed"
    assert upstream.count == 2


# -- 5. operator text a store cannot hold ---------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b'{"outcome": "not_applied", "note": "a\\u0000b"}', id="nul-note"),
        pytest.param(b'{"outcome": "not_applied", "note": "a\\ud800b"}', id="surrogate-note"),
        pytest.param(
            b'{"outcome": "applied", "response": {"status": 201, "body": "a\\u0000b"}}',
            id="nul-body",
        ),
        pytest.param(
            b'{"outcome": "applied", "response": {"status": 201, "body": "\\udc00"}}',
            id="surrogate-body",
        ),
        pytest.param(
            b'{"outcome": "applied", "response": {"status": 201, "headers": {"x-a": "\\u0001"}}}',
            id="control-header-value",
        ),
        pytest.param(
            b'{"outcome": "applied", "response": {"status": 201, "headers": {"x-a": "a\\u007f"}}}',
            id="del-header-value",
        ),
        pytest.param(
            b'{"outcome": "applied", "response": {"status": 201, "headers": {"x\\u00e9": "v"}}}',
            id="non-token-header-name",
        ),
    ],
)
async def test_resolve_text_a_store_cannot_hold_is_400(
    any_store_gateway: RunningGateway, upstream: CountingUpstream, raw: bytes
) -> None:
    """NUL, a lone surrogate or bad header text in a resolve is 400, op unchanged (defect 5)."""
    gateway = any_store_gateway
    before = await make_unknown(gateway, "nul-1")
    for path, credentials in resolve_paths("nul-1", before["id"]):
        response = await post_json(gateway, path, raw, credentials)
        assert response.status == 400, await response.text()
        assert await problem_type(response) == "invalid-request"
    after = await operation(gateway, "nul-1")
    assert (after["state"], after["etag"]) == ("unknown", before["etag"])
    assert upstream.count == 1


async def test_resolve_with_ordinary_text_still_works(
    any_store_gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    """Multi-line notes, tabs and non-ASCII text are still accepted (defect 5's rule is narrow)."""
    gateway = any_store_gateway
    await make_unknown(gateway, "txt-1")
    body = {
        "outcome": "applied",
        "response": {"status": 201, "headers": {"x-a": "tab\there é"}, "body": "Grüße 😀\n"},
        "note": "line one\nline two\twith ☃",
    }
    response = await post_json(gateway, "/operations/txt-1/resolve", json.dumps(body).encode())
    assert response.status == 200, await response.text()
    document = await response.json()
    assert document["resolution"]["note"] == body["note"]
    assert document["response"]["body"] == "Grüße 😀\n"
    assert upstream.count == 1


@pytest.mark.parametrize(
    "reason", [pytest.param("a\\u0000b", id="nul"), pytest.param("\\ud800", id="surrogate")]
)
async def test_redact_reason_a_store_cannot_hold_is_400(
    any_store_gateway: RunningGateway, upstream: CountingUpstream, reason: str
) -> None:
    """A redact reason with NUL or a lone surrogate is 400 and the receipt is kept (defect 5)."""
    gateway = any_store_gateway
    assert (await gateway.post("/tickets/v1/issues", key="pii-1", json_body={})).status == 201
    before = await operation(gateway, "pii-1")
    raw = b'{"reason": "' + reason.encode() + b'"}'
    response = await post_json(gateway, f"/admin/operations/{before['id']}/redact", raw, ADMIN)
    assert response.status == 400, await response.text()
    assert await problem_type(response) == "invalid-request"
    after = await operation(gateway, "pii-1")
    assert after["response"] == before["response"] is not None
    assert after["etag"] == before["etag"]
    assert upstream.count == 1
