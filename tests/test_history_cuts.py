"""History that cannot be quietly cut (issue: "A receipt never depends on the caller").

Three edits found by a black-box review on the main of then, each made by hand with the
store's own tool (`sqlite3`, `psql`) while the gateway was stopped, each passed by
`operations verify`:

- backdating: the forced release's events dropped, the chain re-hashed with plain
  SHA-256, every event's time set before the history key came;
- a `resolved` event's payload set to NULL: the operator's note erased, reported as a
  redaction that never happened;
- the tail cut: events 4 to 8 deleted and the row's head set back, the row still
  saying two attempts.

Here each is found and named by `operations verify` (exit 3), on both stores, with and
without a history key as the contract says: without a key, whoever rewrites the row and
every hash consistently is not caught (there is nothing to sign with), and the tests say
so where it applies.
"""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from harness import ADMIN_TOKEN, RunningGateway, settings_for, start_gateway, stop_gateway
from pg import PG_HOST, PG_PORT
from test_cli import admin, cli
from upstream import CountingUpstream

from gateway.engine.checkpointer import Checkpointer
from gateway.engine.history import event_hash
from gateway.web.appkeys import STORE

KEY = base64.b64encode(bytes(range(32))).decode()
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@dataclass
class Database:
    """The gateway's store as an editor reaches it: through `sqlite3` or `psql`."""

    sqlite: Path | None = None
    schema: str | None = None

    def run(self, sql: str) -> list[list[str]]:
        """Run `sql`; the rows it printed, tab-separated fields."""
        if self.sqlite is not None:
            argv = ["sqlite3", "-batch", "-separator", "\t", str(self.sqlite), sql]
        else:
            argv = ["psql", "-h", PG_HOST, "-p", str(PG_PORT), "-U", "postgres", "-d", "test",
                    "-v", "ON_ERROR_STOP=1", "-At", "-F", "\t",
                    "-c", f"SET search_path TO {self.schema}; {sql}"]  # fmt: skip
        done = subprocess.run(argv, check=True, capture_output=True, text=True, timeout=60)
        return [line.split("\t") for line in done.stdout.splitlines() if line and line != "SET"]


@dataclass
class Setup:
    """How to start a gateway on one store, and reach that store by hand."""

    url: str | None
    database: Database


@pytest.fixture
def setup(store_url: str | None, tmp_path: Path) -> Setup:
    """The gateway's store on each backend (`store_url`), and the way to edit it by hand."""
    if store_url is None:
        return Setup(None, Database(sqlite=tmp_path / "gateway.db"))
    schema = parse_qs(urlsplit(store_url).query)["search_path"][0]
    return Setup(store_url, Database(schema=schema))


async def started(
    setup: Setup, tmp_path: Path, upstream: CountingUpstream, *, keyed: bool
) -> RunningGateway:
    store = {"history_key": KEY} if keyed else {}
    return await start_gateway(
        settings_for(
            tmp_path,
            upstream.url,
            store_url=setup.url,
            store=store,
            admin={"token": ADMIN_TOKEN},
            idempotency={"lease": "2s"},
        )
    )


async def eight_events(gateway: RunningGateway, upstream: CountingUpstream, key: str) -> str:
    """An operation with the review's shape: sent and lost (unknown), released by an
    operator with a note (forced), then sent again and answered: two attempts, eight
    events. Its id."""
    upstream.script = [{"drop": "after_effect"}]
    assert (await gateway.post("/tickets/v1/t", key=key, json_body={})).status == 502
    op_id = (await (await gateway.get(f"/operations/{key}")).json())["id"]
    resolved = await gateway.session.post(
        f"{gateway.admin_url}/admin/operations/{op_id}/resolve",
        json={"outcome": "not_applied", "note": "checked the ticket system: none", "force": True},
        headers=ADMIN,
    )
    assert resolved.status == 200, await resolved.text()
    assert (await gateway.post("/tickets/v1/t", key=key, json_body={})).status == 201
    history = await (
        await gateway.session.get(
            f"{gateway.admin_url}/admin/operations/{op_id}/history", headers=ADMIN
        )
    ).json()
    types = [event["type"] for event in history["items"]]
    assert types == ["claimed", "sent", "connection-lost", "resolved", "released",
                     "claimed", "sent", "answered"], types  # fmt: skip
    return str(op_id)


async def verify(gateway: RunningGateway, key: str, capsys: pytest.CaptureFixture[str]) -> Any:
    """`operations verify KEY --json`: (exit code, the report)."""
    capsys.readouterr()
    code = await cli(admin(gateway, "verify", key, "--json"))
    return code, json.loads(capsys.readouterr().out)


async def edited_while_stopped(
    setup: Setup,
    tmp_path: Path,
    upstream: CountingUpstream,
    *,
    keyed: bool,
    edit: Any,
) -> tuple[RunningGateway, str]:
    """Make the eight-event operation, stop the gateway (its last checkpoint is written),
    `edit(database, operation_id)`, and start a gateway again on the same store."""
    first = await started(setup, tmp_path, upstream, keyed=keyed)
    try:
        op_id = await eight_events(first, upstream, "cut-1")
    finally:
        await stop_gateway(first)
    edit(setup.database, op_id)
    return await started(setup, tmp_path, upstream, keyed=keyed), op_id


def events_of(database: Database, op_id: str) -> list[list[str]]:
    return database.run(
        "SELECT seq, type, at_us, actor, version, data FROM operation_events "
        f"WHERE operation_id = '{op_id}' ORDER BY seq"
    )


def rechain_plain(database: Database, op_id: str, kept: list[list[str]], *, at_us: int) -> None:
    """Make `kept` the whole chain (payloads as they are), renumbered, re-hashed with plain
    SHA-256, every event at `at_us`; the row's head set to match."""
    numbers = ", ".join(event[0] for event in kept)
    database.run(
        f"DELETE FROM operation_events WHERE operation_id = '{op_id}' AND seq NOT IN ({numbers})"
    )
    head = ""
    for seq, (old, type_, _, actor, version, data) in enumerate(kept, start=1):
        digest = event_hash(
            prev=head, seq=seq, at_us=at_us, version=int(version), type=type_, actor=actor,
            data=data,
        )  # fmt: skip
        database.run(
            f"UPDATE operation_events SET seq = {seq}, at_us = {at_us}, prev = '{head}', "
            f"hash = '{digest}' WHERE operation_id = '{op_id}' AND seq = {old}"
        )
        head = digest
    database.run(
        f"UPDATE operations SET history_head = '{head}', history_seq = {len(kept)} "
        f"WHERE id = '{op_id}'"
    )


@pytest.mark.parametrize("keyed", [True, False], ids=["key", "no-key"])
async def test_a_backdated_plain_rechain_is_found_with_a_history_key(
    setup: Setup,
    tmp_path: Path,
    upstream: CountingUpstream,
    capsys: pytest.CaptureFixture[str],
    keyed: bool,
) -> None:
    """The forced release's events dropped, the rest re-hashed plainly and dated a day
    before the key came: with a key, event 1 must be keyed whatever time it claims
    (broken at seq 1); without one, a consistent forgery is the documented limit."""

    def backdate(database: Database, op_id: str) -> None:
        events = events_of(database, op_id)
        kept = [event for event in events if event[1] not in ("resolved", "released")]
        rechain_plain(database, op_id, kept, at_us=int(events[0][2]) - 86_400_000_000)

    gateway, _ = await edited_while_stopped(setup, tmp_path, upstream, keyed=keyed, edit=backdate)
    try:
        code, report = await verify(gateway, "cut-1", capsys)
    finally:
        await stop_gateway(gateway)
    if keyed:
        assert (code, report["ok"], report["broken"]["seq"]) == (3, False, 1)
        assert "not keyed" in report["broken"]["reason"]
    else:
        assert (code, report["ok"]) == (0, True), report["broken"]


@pytest.mark.parametrize("keyed", [True, False], ids=["key", "no-key"])
async def test_an_erased_note_is_an_edit_not_a_redaction(
    setup: Setup,
    tmp_path: Path,
    upstream: CountingUpstream,
    capsys: pytest.CaptureFixture[str],
    keyed: bool,
) -> None:
    """The `resolved` event's payload set to NULL: no `redacted` event names it (and none
    ever erases a note), so verify names the event and the note, key or not."""

    def erase_note(database: Database, op_id: str) -> None:
        database.run(
            "UPDATE operation_events SET payload = NULL "
            f"WHERE operation_id = '{op_id}' AND type = 'resolved'"
        )

    gateway, _ = await edited_while_stopped(setup, tmp_path, upstream, keyed=keyed, edit=erase_note)
    try:
        code, report = await verify(gateway, "cut-1", capsys)
    finally:
        await stop_gateway(gateway)
    assert (code, report["ok"], report["broken"]["seq"]) == (3, False, 4)
    assert "note is gone" in report["broken"]["reason"]
    assert report["redacted"] == []


@pytest.mark.parametrize("keyed", [True, False], ids=["key", "no-key"])
async def test_a_cut_tail_is_found_by_the_row_and_by_the_checkpoint(
    setup: Setup,
    tmp_path: Path,
    upstream: CountingUpstream,
    capsys: pytest.CaptureFixture[str],
    keyed: bool,
) -> None:
    """Events 4-8 deleted and the row's head set back: the row still says attempt 2 at a
    later version (broken at the head, key or not). Rewrite the row to agree as well:
    with a key the checkpoint written at the last stop still saw event 8; without one
    nothing outside the row remembers (the documented limit)."""

    def cut(database: Database, op_id: str) -> None:
        database.run(f"DELETE FROM operation_events WHERE operation_id = '{op_id}' AND seq > 3")
        (head,) = database.run(
            f"SELECT hash FROM operation_events WHERE operation_id = '{op_id}' AND seq = 3"
        )[0]
        database.run(
            f"UPDATE operations SET history_head = '{head}', history_seq = 3 WHERE id = '{op_id}'"
        )

    gateway, op_id = await edited_while_stopped(setup, tmp_path, upstream, keyed=keyed, edit=cut)
    try:
        code, report = await verify(gateway, "cut-1", capsys)
        assert (code, report["ok"], report["broken"]["seq"]) == (3, False, 3)
        assert "the row is at" in report["broken"]["reason"]
    finally:
        await stop_gateway(gateway)

    (version,) = setup.database.run(
        f"SELECT version FROM operation_events WHERE operation_id = '{op_id}' AND seq = 3"
    )[0]
    setup.database.run(
        f"UPDATE operations SET version = {version}, attempts = 1, state = 'unknown' "
        f"WHERE id = '{op_id}'"
    )
    gateway = await started(setup, tmp_path, upstream, keyed=keyed)
    try:
        code, report = await verify(gateway, "cut-1", capsys)
    finally:
        await stop_gateway(gateway)
    if keyed:
        assert (code, report["ok"], report["broken"]["seq"]) == (3, False, 8)
        assert "ends at 3 (its tail was cut)" in report["broken"]["reason"]
    else:
        assert (code, report["ok"]) == (0, True)


async def test_verify_all_checks_the_chain_of_checkpoints(
    tmp_path: Path, upstream: CountingUpstream, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each stop writes a checkpoint of the heads that changed; `verify --all` reports the
    chain of them, and a checkpoint deleted from the middle breaks it."""
    setup = Setup(None, Database(sqlite=tmp_path / "gateway.db"))
    for key in ("a", "b"):
        gateway = await started(setup, tmp_path, upstream, keyed=True)
        try:
            assert (await gateway.post("/tickets/v1/t", key=key, json_body={})).status == 201
        finally:
            await stop_gateway(gateway)
    gateway = await started(setup, tmp_path, upstream, keyed=True)
    try:
        report = await verify_all(gateway)
        assert report["checkpoints"]["ok"] is True
        assert report["checkpoints"]["count"] == 2
        setup.database.run("DELETE FROM history_checkpoint_log WHERE checkpoint = 1")
        report = await verify_all(gateway)
        assert report["checkpoints"]["ok"] is False
        assert "checkpoint 1 is missing" in report["checkpoints"]["broken"]["reason"]
        capsys.readouterr()
        assert await cli(admin(gateway, "verify", "--all")) == 3
    finally:
        await stop_gateway(gateway)


async def verify_all(gateway: RunningGateway) -> Any:
    answer = await gateway.session.get(f"{gateway.admin_url}/admin/verify", headers=ADMIN)
    assert answer.status == 200, await answer.text()
    return await answer.json()


async def test_checkpoints_are_written_while_the_gateway_runs(
    tmp_path: Path, upstream: CountingUpstream
) -> None:
    """The checkpointer writes the heads that changed every interval, not only at a stop
    (here an interval of 50 ms on the running gateway's own store, instead of a minute);
    nothing is written while nothing changes.

    It starts once the call is answered (its history whole): started before, it could
    write the call's head half-way (a call slower than 50 ms, on a loaded machine) and
    the final head at its next pass, rightly, where this test expects a single entry."""
    setup = Setup(None, Database(sqlite=tmp_path / "gateway.db"))
    gateway = await started(setup, tmp_path, upstream, keyed=True)
    store = gateway.app[STORE]
    checkpointer = Checkpointer(store, interval=0.05)
    try:
        assert (await gateway.post("/tickets/v1/t", key="c-1", json_body={})).status == 201
        await checkpointer.start()
        async with asyncio.timeout(30):
            while not (log := await store.checkpoint_log()):  # noqa: ASYNC110 (a table)
                await asyncio.sleep(0.05)
        assert [entry.heads for entry in log] == [1]
        assert await checkpointer.write_once() == 0
    finally:
        await checkpointer.stop()
        await stop_gateway(gateway)
