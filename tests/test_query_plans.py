"""No statement of the hot path reads a big table end to end.

The store is filled with `GATEWAY_PLAN_ROWS` realistic operations (20,000 by
default; `make plans ROWS=10000000` runs the same test at ten million), then a
gateway runs in this process on it and the hot path is driven over real HTTP:
new keys (claim, forward, receipt), replays, a key reused with another body,
a released call and its retry, a call left unknown, lookups of new and of
pre-filled keys, the history and the key's request log, admin searches by
key, by key prefix and by operation-id prefix, and a sweep. Every statement
the store ran is then checked (`tests/plan_capture.py`): a scan of a big
table fails the test and names the statement.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from harness import ADMIN_TOKEN, RunningGateway, settings_for, start_gateway, stop_gateway
from pg import schema_url
from plan_capture import (
    explained_url,
    postgres_plans,
    postgres_scans,
    small_tables,
    sqlite_scans,
    sqlite_statements,
)
from upstream import CountingUpstream

from bench.big_stores import kept_sqlite
from bench.fill_rows import fill_key
from bench.prefill import prefill
from bench.prefill_pg import prefill_postgres
from gateway.engine.sweeper import SWEEP_BATCH
from gateway.web.appkeys import STORE

ROWS = int(os.environ.get("GATEWAY_PLAN_ROWS", "20000"))
KEEP = os.environ.get("GATEWAY_PLAN_KEEP")
"""A directory where `make big-stores KEEP=DIR` keeps its SQLite files (`big-<rows>.db`): the
SQLite test then runs on the one of `ROWS` operations, filling it there if it is missing
(ten million take most of an hour to write). Such a file keeps the test's few writes."""
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest_asyncio.fixture
async def upstream() -> AsyncIterator[CountingUpstream]:
    started = CountingUpstream()
    await started.start()
    yield started
    await started.stop()


async def drive_the_hot_path(gateway: RunningGateway) -> None:
    """Every request kind the hot path serves, and the admin searches, once or more.

    Keys and bodies are this run's own: a kept store (`KEEP`) has the last run's.
    """
    run = secrets.token_hex(4)
    body = {"title": f"plans {run}"}
    first, late, released_key = f"plan-{run}-0", f"plan-{run}-late", f"plan-{run}-503"
    for n in range(3):
        assert (
            await gateway.post("/tickets/v1/issues", key=f"plan-{run}-{n}", json_body=body)
        ).status == 201
    assert (await gateway.post("/tickets/v1/issues", key=first, json_body=body)).status == 201
    mismatch = await gateway.post("/tickets/v1/issues", key=first, json_body={"title": "other"})
    assert mismatch.status == 422
    released = await gateway.post("/tickets/v1/issues?status=503", key=released_key, json_body=body)
    assert released.status == 503
    await gateway.post("/tickets/v1/issues?status=503", key=released_key, json_body=body)
    unknown = await gateway.post("/tickets/v1/issues?delay=5", key=late, json_body=body)
    assert unknown.status == 504
    for key in (first, late, fill_key(7)):
        assert (await gateway.get(f"/operations/{key}")).status == 200
    operation = await (await gateway.session.get(f"{gateway.url}/operations/{first}")).json()
    await wait_for_request_log(gateway, operation["id"])
    assert gateway.admin_url is not None
    for query in (
        f"?key={first}",
        f"?key={fill_key(11)}",
        f"?q=plan-{run}",
        f"?q={fill_key(13)[:8]}",
        f"?q={operation['id'][:12]}",
        "?state=unknown&limit=5",
    ):
        answer = await gateway.session.get(
            gateway.admin_url + "/admin/operations" + query, headers=ADMIN
        )
        assert answer.status == 200, await answer.text()
        assert (await answer.json())["items"], query
    operation_id = operation["id"]
    for path in ("", "/history", "/requests"):
        answer = await gateway.session.get(
            f"{gateway.admin_url}/admin/operations/{operation_id}{path}", headers=ADMIN
        )
        assert answer.status == 200, (path, await answer.text())
    await gateway.app[STORE].sweep(batch=SWEEP_BATCH)


def a_minute_into_the_day() -> float:
    """The end of a PostgreSQL fill whose partitions are, whatever the hour: the day before
    yesterday's and today's slivers (the fill spans 1.01 days), and yesterday's bulk.

    The planner rightly scans a partition of a few pages (the day that has just begun),
    and a fill that ends at the test's own time leaves one only after midnight: the test
    then judged by the hour. Ending here makes every run meet that case.
    """
    now = time.time()
    midnight = datetime.datetime.fromtimestamp(now, datetime.UTC).replace(
        hour=0, minute=0, second=0, microsecond=0
    )
    return min(now, midnight.timestamp() + 60)


async def wait_for_request_log(gateway: RunningGateway, operation_id: str) -> None:
    """The request log is written by a task once a second: wait until it has been."""
    assert gateway.admin_url is not None
    for _ in range(600):
        answer = await gateway.session.get(
            f"{gateway.admin_url}/admin/operations/{operation_id}/requests", headers=ADMIN
        )
        document: dict[str, Any] = await answer.json()
        if document.get("total", 0) >= 1:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the request log was never written")


def _settings(tmp_path: Path, upstream: CountingUpstream, store_url: str) -> Any:
    return settings_for(
        tmp_path,
        upstream.url,
        store_url=store_url,
        route={"timeout": "1s"},
        admin={"token": ADMIN_TOKEN},
    )


async def test_sqlite_hot_path_scans_no_big_table(
    tmp_path: Path, upstream: CountingUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    if KEEP is None:
        path = tmp_path / "plans.db"
        await asyncio.to_thread(prefill, path, ROWS)
    else:
        path, _ = await asyncio.to_thread(kept_sqlite, Path(KEEP), ROWS)
    with sqlite_statements(monkeypatch) as statements:
        gateway = await start_gateway(_settings(tmp_path, upstream, f"sqlite:///{path}"))
        try:
            await drive_the_hot_path(gateway)
        finally:
            await stop_gateway(gateway)
    scans = sqlite_scans(str(path), statements, rows=ROWS)
    assert scans.statements > 20, f"too few statements seen: {scans.statements}"
    assert not scans.found, scans.report()


@pytest.mark.postgres
@pytest.mark.filterwarnings("ignore:.*active log listener:asyncpg.InterfaceWarning")
async def test_postgres_hot_path_scans_no_big_table(
    tmp_path: Path, upstream: CountingUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with schema_url() as url:
        await asyncio.to_thread(prefill_postgres, url, ROWS, now=a_minute_into_the_day())
        with postgres_plans(monkeypatch) as plans:
            gateway = await start_gateway(_settings(tmp_path, upstream, explained_url(url)))
            try:
                await drive_the_hot_path(gateway)
            finally:
                await stop_gateway(gateway)
        small = await small_tables(url)
    scans = postgres_scans(plans, small, rows=ROWS)
    assert scans.statements > 20, f"too few plans seen: {scans.statements}"
    assert not scans.found, scans.report()


async def test_sqlite_prefix_search_pages_alike_by_index_or_by_walk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prefix matching few rows is read through its index ranges, one matching many by a
    walk in creation order (`PREFIX_WALK_FROM`): both give the same pages, in order."""
    import gateway.store.sqlite as sqlite_module
    from gateway.engine.models import ClaimRequest
    from gateway.store.base import OperationFilter

    store = sqlite_module.SqliteStore(path=tmp_path / "s.db")
    await store.open()
    try:
        for n in range(7):
            for scope in ("a", "b"):
                await store.claim(
                    ClaimRequest(scope=scope, key=f"k-{n}", fingerprint="f", route="r",
                                 method="POST", path="/r", owner="o", lease_seconds=30,
                                 tombstone_seconds=600)
                )  # fmt: skip

        async def pages(prefix: str) -> list[list[tuple[str, str]]]:
            found, cursor = [], None
            while True:
                page = await store.list_operations(
                    OperationFilter(prefix=prefix), limit=4, cursor=cursor
                )
                found.append([(op.scope, op.key) for op in page.items])
                if (cursor := page.next_cursor) is None:
                    return found

        by_index = await pages("k-")
        monkeypatch.setattr(sqlite_module, "PREFIX_WALK_FROM", 3)
        by_walk = await pages("k-")
    finally:
        await store.close()
    expected = [(scope, f"k-{n}") for n in range(7) for scope in ("a", "b")]
    assert [item for page in by_index for item in page] == expected
    assert by_walk == by_index
