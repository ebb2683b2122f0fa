"""The command line: `check-config` and the `operations` commands against a real gateway.

`main` runs in a thread (it calls `asyncio.run`) while the gateway and the
counting upstream serve on this test's loop.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest
import pytest_asyncio
from harness import (
    ADMIN_TOKEN,
    RunningGateway,
    effects_for_key,
    settings_for,
    start_gateway,
    stop_gateway,
)
from upstream import CountingUpstream

from gateway.cli import main

DROP = "/tickets/v1/issues?drop=after_effect"


async def cli(argv: Sequence[str]) -> int:
    """Run the CLI in a thread and return its exit code (argparse errors included)."""
    try:
        return await asyncio.to_thread(main, list(argv))
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1


def admin(gateway: RunningGateway, *argv: str, token: str = ADMIN_TOKEN) -> list[str]:
    """`operations ...` argv aimed at `gateway`'s admin listener (its main one when it has
    none: the admin API is then disabled) with an admin token."""
    return ["operations", *argv, "--url", gateway.admin_url or gateway.url, "--token", token]


@pytest_asyncio.fixture
async def admin_gateway(
    tmp_path: Path, upstream: CountingUpstream
) -> AsyncIterator[RunningGateway]:
    """A gateway in front of the counting upstream, with the admin token set."""
    started = await start_gateway(
        settings_for(tmp_path, upstream.url, admin={"token": ADMIN_TOKEN})
    )
    yield started
    await stop_gateway(started)


async def make_unknown(gateway: RunningGateway, key: str) -> None:
    """Send a request whose upstream applies the effect and drops the connection."""
    response = await gateway.post(DROP, key=key, json_body={"title": key})
    assert response.status == 502
    assert response.headers["Idempotency-Status"] == "unknown"


async def complete(gateway: RunningGateway, key: str) -> None:
    """Send a request that the upstream applies and answers: the key is completed."""
    response = await gateway.post("/tickets/v1/issues", key=key, json_body={"title": key})
    assert response.status == 201


async def operation_id(gateway: RunningGateway, key: str) -> str:
    """The id of the operation recorded for `key` (the test requests share one scope)."""
    response = await gateway.get(f"/operations/{key}")
    assert response.status == 200
    document = await response.json()
    assert isinstance(document["id"], str)
    return document["id"]


def write_config(
    path: Path, *, host: str, port: int, token: str | None, admin_port: int = 8081
) -> Path:
    """A minimal gateway TOML file; the admin listener on `host`:`admin_port`."""
    token_line = f'token = "{token}"\n' if token is not None else ""
    path.write_text(
        f'[server]\nhost = "{host}"\nport = {port}\n\n'
        f'[store]\nurl = "sqlite:///{path.parent / "cli.db"}"\n\n'
        f'[admin]\n{token_line}host = "{host}"\nport = {admin_port}\n'
    )
    return path


async def test_check_config_masks_admin_token(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`check-config` prints the effective TOML with the admin token masked."""
    config = write_config(tmp_path / "gateway.toml", host="127.0.0.1", port=8123, token=ADMIN_TOKEN)

    assert await cli(["check-config", "--config", str(config)]) == 0

    out = capsys.readouterr().out
    assert "port = 8123" in out
    assert 'token = "***"' in out
    assert ADMIN_TOKEN not in out


async def test_list_unknown_shows_only_unknown_operations(
    admin_gateway: RunningGateway,
    upstream: CountingUpstream,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`list --state unknown` shows the ambiguous operation and not the completed one."""
    await complete(admin_gateway, "done-1")
    await make_unknown(admin_gateway, "lost-1")
    assert await effects_for_key(upstream, admin_gateway.url, "done-1") == 1
    assert await effects_for_key(upstream, admin_gateway.url, "lost-1") == 1
    unknown_id = await operation_id(admin_gateway, "lost-1")
    completed_id = await operation_id(admin_gateway, "done-1")
    capsys.readouterr()

    assert await cli(admin(admin_gateway, "list", "--state", "unknown")) == 0

    out, err = capsys.readouterr()
    header, *rows = out.splitlines()
    assert header.split() == [
        "ID", "STATE", "ROUTE", "METHOD", "KEY", "ATTEMPTS", "UPDATED_AT", "SCOPE"
    ]  # fmt: skip
    assert len(rows) == 1
    assert rows[0].split()[:6] == [unknown_id, "unknown", "tickets", "POST", "lost-1", "1"]
    assert completed_id not in out
    assert err == ""


async def test_list_json_prints_the_admin_document(
    admin_gateway: RunningGateway,
    upstream: CountingUpstream,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`list --json` prints the admin API's page, scope included."""
    await make_unknown(admin_gateway, "lost-json")
    capsys.readouterr()

    assert await cli(admin(admin_gateway, "list", "--json")) == 0

    document = json.loads(capsys.readouterr().out)
    assert [item["key"] for item in document["items"]] == ["lost-json"]
    assert document["items"][0]["scope"]
    assert document["next_cursor"] is None
    assert await effects_for_key(upstream, admin_gateway.url, "lost-json") == 1


async def test_list_pages(
    admin_gateway: RunningGateway,
    upstream: CountingUpstream,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`--limit 1` prints one page and a cursor hint; `--all` follows the cursor to the end."""
    keys = [f"page-{n}" for n in range(3)]
    for key in keys:
        await complete(admin_gateway, key)
    ids = {await operation_id(admin_gateway, key) for key in keys}
    capsys.readouterr()

    assert await cli(admin(admin_gateway, "list", "--limit", "1")) == 0
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 2
    assert "--cursor" in err

    assert await cli(admin(admin_gateway, "list", "--limit", "1", "--all")) == 0
    out, err = capsys.readouterr()
    assert {row.split()[0] for row in out.splitlines()[1:]} == ids
    assert err == ""
    assert upstream.count == 3


async def test_show_prints_operation_json(
    admin_gateway: RunningGateway,
    upstream: CountingUpstream,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`show ID` prints that operation's JSON, indented."""
    await make_unknown(admin_gateway, "lost-show")
    op_id = await operation_id(admin_gateway, "lost-show")
    capsys.readouterr()

    assert await cli(admin(admin_gateway, "show", op_id)) == 0

    out = capsys.readouterr().out
    assert out.startswith('{\n  "')
    document = json.loads(out)
    assert document["id"] == op_id
    assert document["key"] == "lost-show"
    assert document["state"] == "unknown"
    assert await effects_for_key(upstream, admin_gateway.url, "lost-show") == 1


async def test_resolve_applied_makes_retries_replay(
    admin_gateway: RunningGateway,
    upstream: CountingUpstream,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`resolve --applied` stores the given response; a retry replays it, never re-sending."""
    await make_unknown(admin_gateway, "lost-applied")
    op_id = await operation_id(admin_gateway, "lost-applied")
    capsys.readouterr()

    argv = admin(
        admin_gateway, "resolve", op_id, "--applied", "--status", "201",
        "--body", '{"id": "T-9"}', "--header", "Content-Type: application/json",
        "--note", "checked",
    )  # fmt: skip
    assert await cli(argv) == 0

    document = json.loads(capsys.readouterr().out)
    assert document["id"] == op_id
    assert document["state"] == "completed"
    assert document["resolution"]["by"] == "admin"
    assert document["resolution"]["note"] == "checked"
    retry = await admin_gateway.post(DROP, key="lost-applied", json_body={"title": "lost-applied"})
    assert retry.status == 201
    assert retry.headers["Idempotent-Replayed"] == "true"
    assert retry.headers["Content-Type"].startswith("application/json")
    assert await retry.read() == b'{"id": "T-9"}'
    assert await effects_for_key(upstream, admin_gateway.url, "lost-applied") == 1


async def test_resolve_applied_without_status_sends_no_response(
    admin_gateway: RunningGateway,
    upstream: CountingUpstream,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`resolve --applied` alone completes the key with no receipt; a retry is not forwarded."""
    await make_unknown(admin_gateway, "lost-bare")
    op_id = await operation_id(admin_gateway, "lost-bare")
    capsys.readouterr()

    assert await cli(admin(admin_gateway, "resolve", op_id, "--applied")) == 0

    document = json.loads(capsys.readouterr().out)
    assert document["state"] == "completed"
    assert document["response"] is None
    assert document["resolution"]["by"] == "admin"
    retry = await admin_gateway.post(DROP, key="lost-bare", json_body={"title": "lost-bare"})
    assert retry.status == 409
    assert "Idempotent-Replayed" not in retry.headers
    assert await effects_for_key(upstream, admin_gateway.url, "lost-bare") == 1


async def test_retry_after_bodiless_resolve_does_not_claim_a_delivered_response(
    admin_gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    """Regression: a retry after a bodiless `--applied` is not told a response was delivered."""
    await make_unknown(admin_gateway, "lost-claim")
    op_id = await operation_id(admin_gateway, "lost-claim")
    assert await cli(admin(admin_gateway, "resolve", op_id, "--applied")) == 0

    retry = await admin_gateway.post(DROP, key="lost-claim", json_body={"title": "lost-claim"})

    assert retry.status == 409
    problem = json.loads(await retry.read())
    assert await effects_for_key(upstream, admin_gateway.url, "lost-claim") == 1
    assert "too large" not in problem["detail"]
    assert "delivered" not in problem["detail"]


async def test_resolve_not_applied_releases_the_key(
    admin_gateway: RunningGateway,
    upstream: CountingUpstream,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`resolve --not-applied` releases the key, so the next retry is forwarded again."""
    await make_unknown(admin_gateway, "lost-released")
    op_id = await operation_id(admin_gateway, "lost-released")
    capsys.readouterr()

    assert await cli(admin(admin_gateway, "resolve", op_id, "--not-applied", "--note", "no")) == 0

    document = json.loads(capsys.readouterr().out)
    assert document["state"] == "released"
    assert document["resolution"]["by"] == "admin"
    await admin_gateway.post(DROP, key="lost-released", json_body={"title": "lost-released"})
    assert await effects_for_key(upstream, admin_gateway.url, "lost-released") == 2


async def test_resolve_completed_operation_is_refused(
    admin_gateway: RunningGateway,
    upstream: CountingUpstream,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Resolving an operation that is not unknown exits 1 with the gateway's 409."""
    await complete(admin_gateway, "done-2")
    op_id = await operation_id(admin_gateway, "done-2")
    capsys.readouterr()

    assert await cli(admin(admin_gateway, "resolve", op_id, "--not-applied")) == 1

    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("error: 409 ")
    assert await effects_for_key(upstream, admin_gateway.url, "done-2") == 1


async def test_show_missing_operation_exits_1(
    admin_gateway: RunningGateway,
    upstream: CountingUpstream,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An id the gateway does not know exits 1 with its 404 problem on stderr."""
    assert await cli(admin(admin_gateway, "show", "op_nope")) == 1

    assert capsys.readouterr().err.startswith("error: 404 ")
    assert upstream.count == 0


async def test_wrong_token_exits_1_with_401(
    admin_gateway: RunningGateway,
    upstream: CountingUpstream,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A wrong admin token exits 1 and prints the gateway's 401."""
    await make_unknown(admin_gateway, "lost-token")
    capsys.readouterr()

    assert await cli(admin(admin_gateway, "list", token="wrong")) == 1

    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("error: 401 ")
    assert await effects_for_key(upstream, admin_gateway.url, "lost-token") == 1


async def test_gateway_without_admin_token_exits_1_with_404(
    gateway: RunningGateway, upstream: CountingUpstream, capsys: pytest.CaptureFixture[str]
) -> None:
    """A gateway with no admin token has no admin API: exit 1 with its 404."""
    await make_unknown(gateway, "lost-plain")

    assert await cli(admin(gateway, "list")) == 1

    assert capsys.readouterr().err.startswith("error: 404 ")
    assert await effects_for_key(upstream, gateway.url, "lost-plain") == 1


async def test_unreachable_gateway_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    """A URL where nothing listens exits 2 with a message naming the URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"

    assert await cli(["operations", "list", "--url", url, "--token", ADMIN_TOKEN]) == 2

    err = capsys.readouterr().err
    assert f"cannot reach the gateway at {url}" in err


@pytest.mark.parametrize(
    "options",
    [
        ["--status", "201"],
        ["--not-applied", "--status", "201"],
        ["--not-applied", "--body", "x"],
        ["--applied", "--body", "x"],
        ["--applied", "--status", "201", "--header", "no colon"],
        ["--applied", "--status", "1000"],
    ],
)
async def test_resolve_usage_errors_exit_2(
    admin_gateway: RunningGateway,
    upstream: CountingUpstream,
    options: list[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Response options without `--applied` (or without `--status`) are usage errors."""
    await make_unknown(admin_gateway, "lost-usage")
    op_id = await operation_id(admin_gateway, "lost-usage")
    capsys.readouterr()

    assert await cli(admin(admin_gateway, "resolve", op_id, *options)) == 2

    assert "usage:" in capsys.readouterr().err
    show = await admin_gateway.get("/operations/lost-usage")
    assert (await show.json())["state"] == "unknown"
    assert await effects_for_key(upstream, admin_gateway.url, "lost-usage") == 1


async def test_defaults_come_from_config_and_environment(
    admin_gateway: RunningGateway,
    upstream: CountingUpstream,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Without --url/--token the config's admin address (0.0.0.0 → 127.0.0.1) and the env
    token are used."""
    assert admin_gateway.admin_url is not None
    port = int(admin_gateway.admin_url.rsplit(":", 1)[1])
    config = write_config(
        tmp_path / "ops.toml", host="0.0.0.0", port=8080, admin_port=port, token=None
    )
    monkeypatch.setenv("IDEMPOTENCY_GATEWAY_ADMIN__TOKEN", ADMIN_TOKEN)
    await make_unknown(admin_gateway, "lost-defaults")
    op_id = await operation_id(admin_gateway, "lost-defaults")
    capsys.readouterr()

    assert await cli(["operations", "show", op_id, "--config", str(config)]) == 0

    assert json.loads(capsys.readouterr().out)["key"] == "lost-defaults"
    assert await effects_for_key(upstream, admin_gateway.url, "lost-defaults") == 1


async def test_missing_token_is_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """With no token anywhere the command exits 2 before sending anything."""
    config = write_config(tmp_path / "ops.toml", host="127.0.0.1", port=8080, token=None)
    monkeypatch.delenv("IDEMPOTENCY_GATEWAY_ADMIN__TOKEN", raising=False)

    assert await cli(["operations", "list", "--config", str(config)]) == 2

    assert "no admin token" in capsys.readouterr().err
