"""The issue-25 operator commands against a real gateway: search, history, verify, probe,
redact, and resolve's --force, --share-with-owner, --scope and --actor.

As in test_cli, `main` runs in a thread while the gateway and the counting upstream serve
on this test's loop; the verify tests edit the gateway's SQLite file behind its back.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from conftest import GatewayFactory
from harness import ADMIN_TOKEN, RunningGateway, effects_for_key
from test_cli import admin, cli, complete, make_unknown, operation_id, write_config
from upstream import CountingUpstream, effects_probe

from gateway.cli import operations_history
from gateway.cli.admin_client import ACTOR_ENV_VAR

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}

# A probe whose "not found" stays "too soon" for longer than any run of a test: an unknown
# operation on this route stays unknown (and a not-applied resolve is too early) until the
# effect shows up.
SLOW_PROBE = {"probe": effects_probe(not_applied_after="10m"), "timeout": "2s"}
"""The probe's GETs share the route's timeout: at 200 ms one of thirteen probes timed out on
a loaded machine (a second, different answer in the evidence). Held requests (`?hold=1`)
time out whatever the timeout, so a longer one costs each test its length only."""


@pytest_asyncio.fixture
async def admin_gateway(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> RunningGateway:
    """A gateway in front of the counting upstream, with the admin token set; no probe."""
    return await gateway_factory(upstream.url, admin={"token": ADMIN_TOKEN})


@pytest_asyncio.fixture
async def probing_gateway(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> RunningGateway:
    """A gateway whose route "tickets" has SLOW_PROBE, and whose route "plain" (at /plain)
    has no probe; with the admin token set."""
    plain = {"name": "plain", "prefix": "/plain", "upstream": upstream.url, "timeout": "60s"}
    return await gateway_factory(
        upstream.url, route=SLOW_PROBE, extra_routes=[plain], admin={"token": ADMIN_TOKEN}
    )


async def make_timed_out(gateway: RunningGateway, key: str) -> None:
    """A request the upstream holds past the route's timeout: unknown, no effect (yet)."""
    response = await gateway.post("/tickets/v1/issues?hold=1", key=key, json_body={"title": key})
    assert response.status == 504
    assert response.headers["Idempotency-Status"] == "unknown"


async def admin_json(gateway: RunningGateway, path: str) -> Any:
    response = await gateway.admin_get(path, headers=ADMIN)
    assert response.status == 200, await response.text()
    return await response.json()


async def state_of(gateway: RunningGateway, op_id: str) -> str:
    document = await admin_json(gateway, f"/admin/operations/{op_id}")
    return str(document["state"])


class Terminal(io.StringIO):
    """Standard input as an operator's terminal, with `text` typed ahead."""

    def isatty(self) -> bool:
        return True


# -- search ----------------------------------------------------------------------------------


async def test_search_lists_operations_by_prefix(
    admin_gateway: RunningGateway,
    upstream: CountingUpstream,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`search TEXT` prints list's table of the operations whose key or id starts with TEXT;
    `%` and `_` are plain characters, not wildcards."""
    for key in ("run-7:0:c1", "run-7:0:c2", "run-8:0:c1", "a%b", "axb", "a_b"):
        await complete(admin_gateway, key)
    run7 = {await operation_id(admin_gateway, key) for key in ("run-7:0:c1", "run-7:0:c2")}
    capsys.readouterr()

    assert await cli(admin(admin_gateway, "search", "run-7:")) == 0
    out, err = capsys.readouterr()
    header, *rows = out.splitlines()
    assert header.split() == [
        "ID", "STATE", "ROUTE", "METHOD", "KEY", "ATTEMPTS", "UPDATED_AT", "SCOPE"
    ]  # fmt: skip
    assert {row.split()[0] for row in rows} == run7
    assert err == ""

    for text, keys in (("a%", ["a%b"]), ("a_", ["a_b"])):
        assert await cli(admin(admin_gateway, "search", text, "--json")) == 0
        assert [item["key"] for item in json.loads(capsys.readouterr().out)["items"]] == keys

    op_id = await operation_id(admin_gateway, "run-8:0:c1")
    assert await cli(admin(admin_gateway, "search", op_id[:-4], "--json")) == 0
    assert [item["id"] for item in json.loads(capsys.readouterr().out)["items"]] == [op_id]
    assert upstream.count == 6


async def test_search_pages_like_list(
    admin_gateway: RunningGateway,
    upstream: CountingUpstream,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`--limit 1` prints one match and the cursor hint; `--all` follows it to the last."""
    for n in range(3):
        await complete(admin_gateway, f"paged-{n}")
    await complete(admin_gateway, "other")
    capsys.readouterr()

    assert await cli(admin(admin_gateway, "search", "paged-", "--limit", "1")) == 0
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 2
    assert "--cursor" in err

    assert await cli(admin(admin_gateway, "search", "paged-", "--limit", "1", "--all")) == 0
    out, err = capsys.readouterr()
    assert sorted(row.split()[4] for row in out.splitlines()[1:]) == [
        "paged-0", "paged-1", "paged-2"
    ]  # fmt: skip
    assert err == ""


# -- history ---------------------------------------------------------------------------------


async def test_history_prints_one_line_an_event(
    probing_gateway: RunningGateway,
    upstream: CountingUpstream,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`history KEY`: seq, time, type, actor, details, the note last as written (a line
    break shown as \\n, so one event stays one line)."""
    await make_timed_out(probing_gateway, "hist-1")
    note = "not in the CRM\nasked Bo (ticket #12)"
    argv = admin(
        probing_gateway, "resolve", "hist-1", "--not-applied", "--force", "--yes",
        "--note", note, "--actor", "ann",
    )  # fmt: skip
    assert await cli(argv) == 0
    capsys.readouterr()

    assert await cli(admin(probing_gateway, "history", "hist-1")) == 0

    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert err == ""
    assert [int(line.split()[0]) for line in lines] == list(range(1, len(lines) + 1))
    _, at, kind, actor, *_ = lines[0].split()
    assert (kind, actor) == ("claimed", "gateway")
    assert at.endswith("Z")
    assert [line.split()[2] for line in lines][:2] == ["claimed", "sent"]
    assert "timed-out" in [line.split()[2] for line in lines]
    (resolved,) = [line for line in lines if line.split()[2] == "resolved"]
    assert resolved.split()[3] == "admin:ann"
    assert "outcome=not_applied" in resolved
    assert "force=true" in resolved
    assert resolved.endswith("note: not in the CRM\\nasked Bo (ticket #12)")


async def test_history_json_pages_through_every_event(
    probing_gateway: RunningGateway,
    upstream: CountingUpstream,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`history --json` prints the events as the gateway has them, read page after page
    (two a page here), none twice, the note exactly."""
    await make_timed_out(probing_gateway, "hist-json")
    op_id = await operation_id(probing_gateway, "hist-json")
    for _ in range(2):
        assert await cli(admin(probing_gateway, "probe", op_id)) == 0
    note = "line one\n\tline two \x1b[31m"
    argv = admin(
        probing_gateway, "resolve", op_id, "--not-applied", "--force", "--yes", "--note", note
    )
    assert await cli(argv) == 0
    full = await admin_json(probing_gateway, f"/admin/operations/{op_id}/history")
    monkeypatch.setattr(operations_history, "HISTORY_PAGE", 2)
    capsys.readouterr()

    assert await cli(admin(probing_gateway, "history", op_id, "--json")) == 0

    events = json.loads(capsys.readouterr().out)
    assert len(events) > 4
    assert events == full["items"]
    assert [event["seq"] for event in events] == list(range(1, len(events) + 1))
    (resolved,) = [event for event in events if event["type"] == "resolved"]
    assert resolved["note"] == note


async def test_a_key_in_two_scopes_needs_its_scope(
    admin_gateway: RunningGateway,
    upstream: CountingUpstream,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`history KEY` of a key two callers used lists both and asks for an id or --scope;
    `--scope` picks that scope's operation, and a scope without the key is a 404."""
    for token in ("agent-a", "agent-b"):
        response = await admin_gateway.post(
            "/tickets/v1/issues",
            key="c1",
            json_body={"title": token},
            headers={"Authorization": f"Bearer {token}"},
        )
        assert response.status == 201
    items = (await admin_json(admin_gateway, "/admin/operations?key=c1"))["items"]
    assert len(items) == 2
    capsys.readouterr()

    assert await cli(admin(admin_gateway, "history", "c1")) == 2
    err = capsys.readouterr().err
    assert "key 'c1' is used in 2 scopes; choose one by id, or name its --scope" in err

    for item in items:
        assert await cli(admin(admin_gateway, "history", "c1", "--scope", item["scope"])) == 0
        expected = await admin_json(admin_gateway, f"/admin/operations/{item['id']}/history")
        out = capsys.readouterr().out
        assert len(out.splitlines()) == len(expected["items"])
        assert await cli(admin(admin_gateway, "show", "c1", "--scope", item["scope"])) == 0
        assert json.loads(capsys.readouterr().out)["id"] == item["id"]

    assert await cli(admin(admin_gateway, "history", "c1", "--scope", "client:nobody")) == 1
    assert "in scope 'client:nobody'" in capsys.readouterr().err
    assert upstream.count == 2


# -- resolve: actor, force, too early, sharing -------------------------------------------------


async def test_the_actor_comes_from_the_option_or_the_environment(
    admin_gateway: RunningGateway,
    upstream: CountingUpstream,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Every admin call says who makes it: IDEMPOTENCY_GATEWAY_ACTOR, or --actor over it;
    the history records `admin:<name>`."""
    monkeypatch.setenv(ACTOR_ENV_VAR, "bob")
    for key, extra in (("act-env", []), ("act-option", ["--actor", "ann"])):
        await make_unknown(admin_gateway, key)
        argv = admin(
            admin_gateway, "resolve", key, "--applied", "--status", "201", "--empty-body",
            "--note", "checked", *extra,
        )  # fmt: skip
        assert await cli(argv) == 0
    capsys.readouterr()

    for key, actor in (("act-env", "admin:bob"), ("act-option", "admin:ann")):
        assert await cli(admin(admin_gateway, "history", key)) == 0
        resolved = capsys.readouterr().out.splitlines()[-1].split()
        assert resolved[2:4] == ["resolved", actor]


async def test_the_actor_variable_is_not_read_as_a_setting(
    admin_gateway: RunningGateway,
    upstream: CountingUpstream,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """IDEMPOTENCY_GATEWAY_ACTOR shares the config's prefix: reading the config for the
    --url/--token defaults does not take it for an (unknown) setting."""
    assert admin_gateway.admin_url is not None
    port = int(admin_gateway.admin_url.rsplit(":", 1)[1])
    config = write_config(
        tmp_path / "ops.toml", host="127.0.0.1", port=8080, admin_port=port, token=ADMIN_TOKEN
    )
    monkeypatch.setenv(ACTOR_ENV_VAR, "carol")
    await complete(admin_gateway, "act-config")
    capsys.readouterr()

    assert await cli(["operations", "history", "act-config", "--config", str(config)]) == 0

    out, err = capsys.readouterr()
    assert out.splitlines()[0].split()[2] == "claimed"
    assert err == ""


async def test_a_too_early_release_prints_the_detail_and_retry_after(
    probing_gateway: RunningGateway,
    upstream: CountingUpstream,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """While the tool may still apply the last send, `resolve --not-applied` exits 1 with
    the gateway's detail and its Retry-After, changing nothing and not suggesting --force;
    with --force the key is released and the history records the force."""
    await make_timed_out(probing_gateway, "early-1")
    op_id = await operation_id(probing_gateway, "early-1")
    capsys.readouterr()

    assert await cli(admin(probing_gateway, "resolve", op_id, "--not-applied", "--note", "x")) == 1

    out, err = capsys.readouterr()
    assert out == ""
    first, second, third = err.splitlines()
    assert first.startswith("error: 409 too-early: ")
    assert second.startswith("retry after ")
    assert "force" not in second
    assert "--force" not in err
    # The instant once (the gateway's words name it), and the way not to wait: the probe.
    (allowed_at,) = re.findall(r"\d{4}-\d\d-\d\dT[\d:.]+Z", err)
    assert allowed_at in first
    assert third == f"or ask the tool now: idempotency-gateway operations probe {op_id}"
    assert await state_of(probing_gateway, op_id) == "unknown"

    argv = admin(
        probing_gateway, "resolve", op_id, "--not-applied", "--force", "--yes", "--note", "x"
    )
    assert await cli(argv) == 0
    assert json.loads(capsys.readouterr().out)["state"] == "released"
    events = (await admin_json(probing_gateway, f"/admin/operations/{op_id}/history"))["items"]
    (resolved,) = [event for event in events if event["type"] == "resolved"]
    assert resolved["force"] is True
    assert upstream.count == 0


async def test_share_with_owner_shows_the_note_to_the_owner(
    admin_gateway: RunningGateway,
    upstream: CountingUpstream,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The owner's lookup shows an admin's note only when it was shared."""
    for key, extra in (("shared", ["--share-with-owner"]), ("private", [])):
        await make_unknown(admin_gateway, key)
        argv = admin(
            admin_gateway, "resolve", key, "--applied", "--status", "201", "--empty-body",
            "--note", f"note of {key}", "--actor", "ann", *extra,
        )  # fmt: skip
        assert await cli(argv) == 0
    capsys.readouterr()

    for key, shown in (("shared", True), ("private", False)):
        response = await admin_gateway.get(f"/operations/{key}")
        resolved = (await response.json())["history"][-1]
        assert resolved["type"] == "resolved"
        assert resolved["actor"] == "an operator"
        assert ("note" in resolved and resolved["note"] == f"note of {key}") is shown


# -- verify ----------------------------------------------------------------------------------


def edit_event(database: Path, op_id: str, seq: int) -> None:
    """Change one stored event's data behind the gateway's back, as a hand edit would."""
    with sqlite3.connect(database) as connection:
        (data,) = connection.execute(
            "SELECT data FROM operation_events WHERE operation_id = ? AND seq = ?", (op_id, seq)
        ).fetchone()
        edited = {**json.loads(data), "attempt": 7}
        connection.execute(
            "UPDATE operation_events SET data = ? WHERE operation_id = ? AND seq = ?",
            (json.dumps(edited, separators=(",", ":"), sort_keys=True), op_id, seq),
        )
    connection.close()


async def test_verify_an_intact_chain_with_redacted_events(
    admin_gateway: RunningGateway,
    upstream: CountingUpstream,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An untouched history verifies (exit 0); an event whose recorded request a redaction
    erased is reported as redacted, not broken; `--all` checks every operation."""
    await complete(admin_gateway, "intact")
    await complete(admin_gateway, "erased")
    assert await cli(admin(admin_gateway, "redact", "erased", "--reason", "GDPR", "--yes")) == 0
    capsys.readouterr()

    assert await cli(admin(admin_gateway, "verify", "intact")) == 0
    out = capsys.readouterr().out
    assert out.endswith("chain intact\n")
    assert "key 'intact'" in out

    assert await cli(admin(admin_gateway, "verify", "erased")) == 0
    out, err = capsys.readouterr()
    head, redacted = out.splitlines()
    assert head.endswith("chain intact")
    assert redacted.startswith("  redacted (erased on purpose, not broken): seq 1")
    assert err == ""

    assert await cli(admin(admin_gateway, "verify", "--all")) == 0
    assert capsys.readouterr().out == (
        "checked 2 operations: every history chain is intact (1 event redacted on purpose, "
        "not broken)\n"
    )


async def test_verify_names_an_edited_event(
    admin_gateway: RunningGateway,
    upstream: CountingUpstream,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A history row edited in the database breaks the chain: `verify` and `verify --all`
    exit 3 naming the operation, its key and the edited seq; the other chain is intact."""
    await complete(admin_gateway, "edited")
    await make_unknown(admin_gateway, "untouched")
    op_id = await operation_id(admin_gateway, "edited")
    edit_event(tmp_path / "gateway.db", op_id, seq=1)
    capsys.readouterr()

    assert await cli(admin(admin_gateway, "verify", "edited")) == 3
    out, err = capsys.readouterr()
    assert "chain broken at seq 1" in out
    assert err.startswith(f"history chain broken: operation {op_id}, key 'edited', scope ")
    assert ", seq 1: " in err

    assert await cli(admin(admin_gateway, "verify", "untouched")) == 0
    capsys.readouterr()

    assert await cli(admin(admin_gateway, "verify", "--all")) == 3
    out, err = capsys.readouterr()
    summary, broken = out.splitlines()
    assert summary == "checked 2 operations: 1 with a broken history chain"
    assert broken.startswith(f"  operation {op_id}, key 'edited', ")
    assert err.startswith(f"history chain broken: operation {op_id}, key 'edited', ")
    assert ", seq 1: " in err

    assert await cli(admin(admin_gateway, "verify", "--all", "--json")) == 3
    document = json.loads(capsys.readouterr().out)
    assert [(item["id"], item["seq"]) for item in document["broken"]] == [(op_id, 1)]


# -- probe -----------------------------------------------------------------------------------


async def test_probe_one_operation_prints_its_state(
    probing_gateway: RunningGateway,
    upstream: CountingUpstream,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`probe REF` asks the tool now: no effect yet leaves it unknown (too soon to say
    not applied); once the late effect exists, the probe completes the operation."""
    await make_timed_out(probing_gateway, "probe-1")
    op_id = await operation_id(probing_gateway, "probe-1")
    capsys.readouterr()

    assert await cli(admin(probing_gateway, "probe", "probe-1")) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{op_id} key 'probe-1': still unknown; probe verdict ")
    assert "status 404" in out

    upstream.release_held()  # the upstream applies it now, after the caller gave up
    await upstream.wait_for_count(1, seconds=60)
    assert await cli(admin(probing_gateway, "probe", op_id, "--actor", "ann")) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{op_id} key 'probe-1': completed (was unknown); probe verdict ")
    assert await state_of(probing_gateway, op_id) == "completed"
    assert await effects_for_key(upstream, probing_gateway.url, "probe-1") == 1


async def test_show_keeps_a_repeated_probe_answer_once(
    probing_gateway: RunningGateway,
    upstream: CountingUpstream,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Thirteen probes that hear the same "too soon" leave the probe's words once in the
    evidence and once in the history (one event counting the asks), not thirteen times
    each: `show` stays short enough to read."""
    await make_timed_out(probing_gateway, "probe-13")
    op_id = await operation_id(probing_gateway, "probe-13")
    for _ in range(13):
        assert await cli(admin(probing_gateway, "probe", "probe-13")) == 0
    capsys.readouterr()

    assert await cli(admin(probing_gateway, "show", op_id)) == 0

    out = capsys.readouterr().out
    document = json.loads(out)
    probes = [item for item in document["evidence"] if item["source"] == "probe"]
    assert len(probes) == 1, probes
    events = [event for event in document["history"] if event["type"] == "probe"]
    assert [event.get("count") for event in events] == [14]  # the gateway's own first ask
    assert out.count(probes[0]["detail"]) == 2
    assert len(out.splitlines()) < 120


async def test_one_instant_is_written_one_way(
    probing_gateway: RunningGateway, capsys: pytest.CaptureFixture[str]
) -> None:
    """The operation's creation and its `claimed` event are the same instant, and `show`
    writes them alike (to the microsecond, as every time in the document)."""
    await make_timed_out(probing_gateway, "instant-1")
    capsys.readouterr()

    assert await cli(admin(probing_gateway, "show", "instant-1")) == 0

    document = json.loads(capsys.readouterr().out)
    claimed = next(event for event in document["history"] if event["type"] == "claimed")
    assert document["created_at"] == claimed["at"]
    times = [document[name] for name in ("created_at", "updated_at", "lease_expires_at")]
    times += [item["at"] for item in document["evidence"]] + [document["may_apply_until"]]
    for value in times:
        assert len(value) == len("2026-12-04T11:09:27.050628Z"), value


async def test_probe_refusals_exit_1(
    probing_gateway: RunningGateway,
    upstream: CountingUpstream,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A completed operation is not probed (409); one whose route has no probe cannot be
    (400); neither changes."""
    await complete(probing_gateway, "probe-done")
    response = await probing_gateway.post(
        "/plain/v1/issues?drop=after_effect", key="no-probe", json_body={}
    )
    assert response.status == 502
    capsys.readouterr()

    assert await cli(admin(probing_gateway, "probe", "probe-done")) == 1
    assert capsys.readouterr().err.startswith("error: 409 ")
    assert await cli(admin(probing_gateway, "probe", "no-probe")) == 1
    assert capsys.readouterr().err.startswith("error: 400 ")
    assert await state_of(probing_gateway, await operation_id(probing_gateway, "no-probe")) == (
        "unknown"
    )


async def test_probe_a_route_waits_for_the_job(
    probing_gateway: RunningGateway,
    upstream: CountingUpstream,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`probe --route` starts the route's job, waits until it is done and prints its
    counts: the two operations whose effects arrived late are applied."""
    for key in ("route-1", "route-2"):
        await make_timed_out(probing_gateway, key)
    await complete(probing_gateway, "route-done")
    upstream.release_held()
    await upstream.wait_for_count(3, seconds=60)
    capsys.readouterr()

    assert await cli(admin(probing_gateway, "probe", "--route", "tickets")) == 0

    out, err = capsys.readouterr()
    assert out == (
        "route tickets: probed 2 of 2 unknown operations: 2 applied, 0 not applied, "
        "0 still unknown\n"
    )
    assert "probing the unknown operations of route tickets" in err
    for key in ("route-1", "route-2"):
        assert await state_of(probing_gateway, await operation_id(probing_gateway, key)) == (
            "completed"
        )


async def test_probe_a_route_gives_up_after_its_timeout(
    gateway_factory: GatewayFactory,
    upstream: CountingUpstream,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A job still running at --timeout: exit 4, saying it goes on in the gateway; and it
    does, to its end."""
    # A probe may take the route's timeout: 30 s, so only the hold decides when it answers.
    route = {"probe": effects_probe(not_applied_after="10m"), "timeout": "30s"}
    gateway = await gateway_factory(upstream.url, route=route, admin={"token": ADMIN_TOKEN})
    await make_unknown(gateway, "slow-1")  # the effect exists: the probe will find it
    hold = asyncio.Event()
    upstream.probe_holds.append(hold)  # the job's probe waits for it
    capsys.readouterr()

    argv = admin(gateway, "probe", "--route", "tickets", "--timeout", "500ms")
    assert await cli(argv) == 4

    out, err = capsys.readouterr()
    assert out == ""
    assert "gave up waiting after 0.5 s: the probe job of route tickets is still running" in err
    assert "(probed 0 of 1 so far)" in err
    assert "run this command again to follow it" in err
    assert await state_of(gateway, await operation_id(gateway, "slow-1")) == "unknown"

    hold.set()
    async with asyncio.timeout(60):  # bounds a hang only
        while True:
            job = await admin_json(gateway, "/admin/probe-jobs/tickets")
            if job["state"] == "done":
                break
            await asyncio.sleep(0.05)
    assert (job["probed"], job["applied"]) == (1, 1)
    assert await state_of(gateway, await operation_id(gateway, "slow-1")) == "completed"


# -- redact ----------------------------------------------------------------------------------


async def test_redact_asks_for_the_key_on_a_terminal(
    admin_gateway: RunningGateway,
    upstream: CountingUpstream,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """On a terminal, `redact` erases only after the key is typed; a wrong answer exits 1
    and erases nothing."""
    await complete(admin_gateway, "pii-1")
    op_id = await operation_id(admin_gateway, "pii-1")
    argv = admin(admin_gateway, "redact", "pii-1", "--reason", "GDPR request 12")
    capsys.readouterr()

    monkeypatch.setattr(sys, "stdin", Terminal("pii-2\n"))
    assert await cli(argv) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert "Type the key to confirm: " in err
    assert err.endswith("not confirmed (the key typed does not match): nothing was erased\n")
    document = await admin_json(admin_gateway, f"/admin/operations/{op_id}")
    assert document["request"]["body"] == '{"title": "pii-1"}'
    assert document["request"].get("body_gone") is None

    monkeypatch.setattr(sys, "stdin", Terminal("pii-1\n"))
    assert await cli(argv) == 0
    assert json.loads(capsys.readouterr().out)["request"]["body_gone"] == "redacted"
    events = (await admin_json(admin_gateway, f"/admin/operations/{op_id}/history"))["items"]
    assert events[-1]["type"] == "redacted"
    assert events[-1]["reason"] == "GDPR request 12"
    retry = await admin_gateway.post(
        "/tickets/v1/issues", key="pii-1", json_body={"title": "pii-1"}
    )
    assert retry.status == 409
    assert (await retry.json())["type"].endswith("receipt-not-retained")
    assert await effects_for_key(upstream, admin_gateway.url, "pii-1") == 1


async def test_redact_without_a_terminal_needs_yes(
    admin_gateway: RunningGateway,
    upstream: CountingUpstream,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Without a terminal to type the key on, `redact` refuses (exit 2) unless --yes."""
    await make_unknown(admin_gateway, "pii-pipe")
    op_id = await operation_id(admin_gateway, "pii-pipe")
    monkeypatch.setattr(sys, "stdin", io.StringIO("pii-pipe\n"))
    argv = admin(admin_gateway, "redact", op_id, "--reason", "asked")
    capsys.readouterr()

    assert await cli(argv) == 2
    assert "refusing to redact without confirmation" in capsys.readouterr().err
    document = await admin_json(admin_gateway, f"/admin/operations/{op_id}")
    assert document["request"].get("body_gone") is None

    assert await cli([*argv, "--yes"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["state"] == "unknown"
    assert document["request"]["body_gone"] == "redacted"


# -- usage -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["verify"],
        ["verify", "k", "--all"],
        ["verify", "--all", "--scope", "s"],
        ["probe"],
        ["probe", "k", "--route", "tickets"],
        ["probe", "--route", "tickets", "--timeout", "0"],
        ["resolve", "k", "--applied", "--force", "--no-receipt", "--note", "x"],
        ["resolve", "k", "--not-applied", "--share-with-owner"],
        ["search", ""],
        ["redact", "k", "--reason", " ", "--yes"],
        ["redact", "k"],
    ],
)
async def test_usage_errors_exit_2(
    admin_gateway: RunningGateway,
    upstream: CountingUpstream,
    argv: list[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Options that do not go together are refused before anything is sent."""
    await make_unknown(admin_gateway, "k")
    capsys.readouterr()

    assert await cli(admin(admin_gateway, *argv)) == 2

    assert "usage:" in capsys.readouterr().err
    assert await state_of(admin_gateway, await operation_id(admin_gateway, "k")) == "unknown"
    assert upstream.count == 1


async def test_an_actor_the_gateway_would_refuse_is_a_usage_error(
    admin_gateway: RunningGateway, capsys: pytest.CaptureFixture[str]
) -> None:
    """An actor is sent as a header the gateway takes as 1 to 64 printable ASCII
    characters: anything else is refused before sending."""
    assert await cli(admin(admin_gateway, "list", "--actor", "ann\nX-Evil: 1")) == 2
    assert "invalid --actor" in capsys.readouterr().err
    assert await cli(admin(admin_gateway, "list", "--actor", "a" * 65)) == 2
    assert "1 to 64 printable ASCII characters" in capsys.readouterr().err
