"""The command line: `check-config` and the `operations` commands against a real gateway.

`main` runs in a thread (it calls `asyncio.run`) while the gateway and the
counting upstream serve on this test's loop.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
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
from gateway.cli.operations import error_line
from gateway.config import ENV_PREFIX
from gateway.engine.errors import PreconditionFailed
from gateway.web.problems import problem_document

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
    path: Path,
    *,
    host: str,
    port: int,
    token: str | None,
    admin_port: int = 8081,
    upstream: str | None = None,
) -> Path:
    """A minimal gateway TOML file; the admin listener on `host`:`admin_port`; with
    `upstream`, one route /tickets in front of it (serving needs one)."""
    token_line = f'token = "{token}"\n' if token is not None else ""
    route = (
        f'\n[[routes]]\nname = "tickets"\nprefix = "/tickets"\nupstream = "{upstream}"\n'
        if upstream is not None
        else ""
    )
    path.write_text(
        f'[server]\nhost = "{host}"\nport = {port}\n\n'
        f'[store]\nurl = "sqlite:///{path.parent / "cli.db"}"\n\n'
        f'[admin]\n{token_line}host = "{host}"\nport = {admin_port}\n{route}'
    )
    return path


async def test_check_config_masks_admin_token(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`check-config` prints the effective TOML with the admin token masked."""
    config = write_config(
        tmp_path / "gateway.toml",
        host="127.0.0.1",
        port=8123,
        token=ADMIN_TOKEN,
        upstream="http://127.0.0.1:9000",
    )

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


async def test_resolve_applied_without_a_receipt_needs_saying_so(
    admin_gateway: RunningGateway,
    upstream: CountingUpstream,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`resolve --applied` with no `--status` was accepted and only warned afterwards (a
    slip made permanent): it is now a usage error that says the two ways, and
    `--no-receipt` completes the key with no receipt, saying how to attach one later; a
    retry is not forwarded."""
    await make_unknown(admin_gateway, "lost-bare")
    op_id = await operation_id(admin_gateway, "lost-bare")
    capsys.readouterr()

    assert await cli(admin(admin_gateway, "resolve", op_id, "--applied", "--note", "x")) == 2
    err = capsys.readouterr().err
    assert "--applied needs the response retries should get" in err
    assert "--no-receipt" in err
    argv = admin(admin_gateway, "resolve", op_id, "--applied", "--no-receipt", "--note", "x")
    assert await cli(argv) == 0

    out, err = capsys.readouterr()
    assert err.startswith("note: completed without a receipt")
    assert "receipt-not-retained" in err
    assert "operations attach" in err
    document = json.loads(out)
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
    argv = admin(admin_gateway, "resolve", op_id, "--applied", "--no-receipt", "--note", "x")
    assert await cli(argv) == 0

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
    """`resolve --not-applied` releases the key, so the next retry is forwarded again.

    Released at once, so `--force` (the too-early refusal has its own test, in
    test_cli_history)."""
    await make_unknown(admin_gateway, "lost-released")
    op_id = await operation_id(admin_gateway, "lost-released")
    capsys.readouterr()

    argv = admin(
        admin_gateway, "resolve", op_id, "--not-applied", "--force", "--yes", "--note", "no"
    )
    assert await cli(argv) == 0

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

    assert await cli(admin(admin_gateway, "resolve", op_id, "--not-applied", "--note", "x")) == 1

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


async def test_unreachable_gateway_exits_2(
    capsys: pytest.CaptureFixture[str], refused_port: int
) -> None:
    """A URL where nothing listens exits 2 with a message naming the URL."""
    url = f"http://127.0.0.1:{refused_port}"

    assert await cli(["operations", "list", "--url", url, "--token", ADMIN_TOKEN]) == 2

    err = capsys.readouterr().err
    assert f"cannot reach the gateway at {url}" in err


@pytest.mark.parametrize(
    "options",
    [
        ["--status", "201", "--note", "x"],
        ["--not-applied", "--status", "201", "--note", "x"],
        ["--not-applied", "--body", "x", "--note", "x"],
        ["--applied", "--body", "x", "--note", "x"],
        ["--applied", "--status", "201", "--header", "no colon", "--body", "x", "--note", "x"],
        ["--applied", "--status", "1000", "--body", "x", "--note", "x"],
        # The console's guard rails (issue "The operator's second hour"):
        ["--not-applied"],  # no note
        ["--not-applied", "--note", "  "],  # a blank one
        ["--applied", "--note", "x"],  # neither a receipt nor --no-receipt
        ["--applied", "--status", "200", "--note", "x"],  # an empty answer, unsaid
        ["--applied", "--status", "200", "--body", "", "--note", "x"],
        ["--applied", "--no-receipt", "--status", "200", "--body", "x", "--note", "x"],
        ["--not-applied", "--no-receipt", "--note", "x"],
        ["--applied", "--status", "200", "--body", "x", "--empty-body", "--note", "x"],
        ["--not-applied", "--yes", "--note", "x"],  # --yes confirms only --force
        ["--not-applied", "--force", "--note", "x"],  # no terminal here, no --yes
    ],
)
async def test_resolve_usage_errors_exit_2(
    admin_gateway: RunningGateway,
    upstream: CountingUpstream,
    options: list[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Response options without `--applied` (or without `--status`) are usage errors, and
    so is each slip the console refuses: no note, `--applied` that does not say what
    retries get, an empty answer not said to be empty, `--force` unconfirmed. Nothing is
    changed."""
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


# -- starting without routes, and configuration errors -----------------------------------------


def gateway_process(
    argv: Sequence[str], *, cwd: Path, timeout: float = 20.0
) -> subprocess.CompletedProcess[str]:
    """`python -m gateway ARGV` in `cwd` with no IDEMPOTENCY_GATEWAY_* variable set; a command
    still running after `timeout` (a gateway that started serving) is killed and fails the test."""
    env = {name: value for name, value in os.environ.items() if not name.startswith(ENV_PREFIX)}
    try:
        return subprocess.run(
            [sys.executable, "-m", "gateway", *argv],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"`gateway {' '.join(argv)}` was still running after {timeout:g}s: {exc}")


def test_serve_without_a_config_refuses_to_start_and_creates_nothing(tmp_path: Path) -> None:
    """No --config and no config/gateway.toml here: no routes, so `serve` exits 2 naming the
    file it looked for, and writes nothing (no ./data/gateway.db) where it ran."""
    result = gateway_process(["serve", "--port", "0"], cwd=tmp_path)

    assert result.returncode == 2, result.stdout + result.stderr
    assert "listening" not in result.stdout
    assert "no routes configured" in result.stderr
    assert f"looked for config/gateway.toml in {tmp_path} (not found)" in result.stderr
    assert "--config PATH" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert list(tmp_path.iterdir()) == []


def test_serve_with_a_config_without_routes_refuses_to_start(tmp_path: Path) -> None:
    """A config file with no [[routes]] would answer 404 to everything: exit 2, naming it."""
    config = write_config(tmp_path / "gateway.toml", host="127.0.0.1", port=0, token=None)

    result = gateway_process(["serve", "--config", str(config)], cwd=tmp_path)

    assert result.returncode == 2, result.stdout + result.stderr
    assert f"{config} has no [[routes]]" in result.stderr
    assert not (tmp_path / "cli.db").exists()


async def test_check_config_without_routes_is_an_invalid_configuration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`check-config` says what `serve` says: no config file, or one without [[routes]], is an
    invalid configuration (exit 2), not a valid one with nothing in it."""
    for name in [name for name in os.environ if name.startswith(ENV_PREFIX)]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)

    assert await cli(["check-config"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("idempotency-gateway: invalid configuration")
    assert "no routes configured: looked for config/gateway.toml" in err

    config = write_config(tmp_path / "bare.toml", host="127.0.0.1", port=8123, token=None)
    assert await cli(["check-config", "--config", str(config)]) == 2
    assert f"{config} has no [[routes]]" in capsys.readouterr().err


async def test_an_invalid_configuration_is_announced_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The loader's message already says "invalid configuration in FILE:"; the CLI does not
    put a second header above it."""
    config = tmp_path / "bad.toml"
    config.write_text('[server]\nport = "eighty"\n')

    assert await cli(["check-config", "--config", str(config)]) == 2

    err = capsys.readouterr().err
    assert err.count("invalid configuration") == 1, err
    assert err.startswith(f"idempotency-gateway: invalid configuration in {config}:\n")
    assert "server.port" in err


# -- resolve: conflicts, the receipt, and keys -------------------------------------------------


async def test_a_resolve_conflict_is_said_once(
    admin_gateway: RunningGateway,
    upstream: CountingUpstream,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """409 not-resolvable prints one line that says it once: the problem type and the detail,
    not the title followed by a detail that repeats it."""
    await complete(admin_gateway, "done-once")
    op_id = await operation_id(admin_gateway, "done-once")
    capsys.readouterr()

    assert await cli(admin(admin_gateway, "resolve", op_id, "--not-applied", "--note", "x")) == 1

    assert capsys.readouterr().err == (
        "error: 409 not-resolvable: the operation is completed; only an unknown one can be "
        "resolved\n"
    )
    assert await effects_for_key(upstream, admin_gateway.url, "done-once") == 1


def test_a_precondition_failure_is_said_once() -> None:
    """412 precondition-failed (a resolve that lost a race) prints its detail once."""
    error = PreconditionFailed(
        "the operation changed since it was read (If-Match did not match)",
        key="k",
        state="unknown",
        operation_id="op_1",
    )
    raw = json.dumps(problem_document(error)).encode()

    line = error_line(412, "Precondition Failed", raw)

    assert line == (
        "error: 412 precondition-failed: the operation changed since it was read "
        "(If-Match did not match)"
    )


async def test_show_accepts_a_key(
    admin_gateway: RunningGateway,
    upstream: CountingUpstream,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`show KEY` (the key from an agent's log, not the id) prints that key's operation."""
    await make_unknown(admin_gateway, "run-9:0:c1")
    op_id = await operation_id(admin_gateway, "run-9:0:c1")
    await complete(admin_gateway, "run-9:0:c2")
    capsys.readouterr()

    assert await cli(admin(admin_gateway, "show", "run-9:0:c1")) == 0

    document = json.loads(capsys.readouterr().out)
    assert document["id"] == op_id
    assert document["key"] == "run-9:0:c1"
    assert document["state"] == "unknown"
    assert await effects_for_key(upstream, admin_gateway.url, "run-9:0:c1") == 1


async def test_a_key_in_several_scopes_asks_for_an_id(
    admin_gateway: RunningGateway,
    upstream: CountingUpstream,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A key two callers (two scopes) used is two operations: `show KEY` and `resolve KEY`
    list both and ask for an id (exit 2), changing nothing."""
    for token in ("agent-a", "agent-b"):
        response = await admin_gateway.post(
            DROP,
            key="c1",
            json_body={"title": token},
            headers={"Authorization": f"Bearer {token}"},
        )
        assert response.status == 502
    page = await admin_gateway.admin_get(
        "/admin/operations", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
    )
    ids = [item["id"] for item in (await page.json())["items"]]
    assert len(ids) == 2
    capsys.readouterr()

    for argv in (("show", "c1"), ("resolve", "c1", "--not-applied", "--note", "x")):
        assert await cli(admin(admin_gateway, *argv)) == 2
        out, err = capsys.readouterr()
        assert out == ""
        assert "key 'c1' is used in 2 scopes; choose one by id" in err
        assert all(op_id in err for op_id in ids)

    page = await admin_gateway.admin_get(
        "/admin/operations?state=unknown", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
    )
    assert len((await page.json())["items"]) == 2
    assert upstream.count == 2


async def test_resolve_accepts_a_key(
    admin_gateway: RunningGateway,
    upstream: CountingUpstream,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`resolve KEY --not-applied --force` settles the one operation with that key."""
    await make_unknown(admin_gateway, "run-9:1:c1")
    capsys.readouterr()

    argv = admin(
        admin_gateway, "resolve", "run-9:1:c1", "--not-applied", "--force", "--yes", "--note", "x"
    )
    assert await cli(argv) == 0

    assert json.loads(capsys.readouterr().out)["state"] == "released"
    await admin_gateway.post(DROP, key="run-9:1:c1", json_body={"title": "run-9:1:c1"})
    assert await effects_for_key(upstream, admin_gateway.url, "run-9:1:c1") == 2


async def test_the_key_filter_of_the_admin_list(
    admin_gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    """GET /admin/operations?key=K lists K's operations only, in every scope."""
    for token in ("agent-a", "agent-b"):
        await admin_gateway.post(
            "/tickets/v1/issues",
            key="k-filter",
            json_body={},
            headers={"Authorization": f"Bearer {token}"},
        )
    await complete(admin_gateway, "k-filter-other")

    page = await admin_gateway.admin_get(
        "/admin/operations?key=k-filter", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
    )

    items = (await page.json())["items"]
    assert [item["key"] for item in items] == ["k-filter", "k-filter"]
    assert len({item["scope"] for item in items}) == 2
    assert upstream.count == 3
