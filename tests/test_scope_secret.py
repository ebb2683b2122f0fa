"""A store that holds operations but lost its scope secret refuses to start.

Header-derived scopes are an HMAC keyed by the secret in the store. Were a
new secret made beside existing operations, every caller would land in a
new scope: a retry of a key already sent (in flight, unknown, completed)
would be met as a new key and sent again. So the secret is made on first
start only, on both stores, and a gateway on such a store exits with one
line instead of serving.
"""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import closing
from pathlib import Path

import aiohttp
import asyncpg
import pytest
import pytest_asyncio
from harness import ROOT, GatewayProcess, spawn
from pg import PG_URL, claim_request, drop_schema, fresh_schema, require_postgres, url_for
from upstream import CountingUpstream

from gateway.engine.errors import StoreUnavailable
from gateway.engine.models import NewAttempt
from gateway.store.base import Store
from gateway.store.sqlite import SqliteStore

StoreKind = tuple[Callable[[], Store], Callable[[], Awaitable[None]]]
"""A way to open a store on one database, and a way to delete that database's secret."""


@pytest_asyncio.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    ]
)
async def kind(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[StoreKind]:
    if request.param == "sqlite":
        path = tmp_path / "s.db"

        async def forget_sqlite() -> None:
            with closing(sqlite3.connect(path)) as connection, connection:
                connection.execute("DELETE FROM gateway_meta WHERE name = 'scope_secret'")

        yield (lambda: SqliteStore(path=path, busy_timeout=1.0)), forget_sqlite
        return
    postgres_store = require_postgres()
    schema = await fresh_schema()

    async def forget_postgres() -> None:
        connection = await asyncpg.connect(PG_URL)
        try:
            await connection.execute(
                f"DELETE FROM {schema}.gateway_meta WHERE name = 'scope_secret'"
            )
        finally:
            await connection.close()

    try:
        yield (lambda: postgres_store(url_for(schema), pool_size=2)), forget_postgres
    finally:
        await drop_schema(schema)


async def test_a_store_with_operations_and_no_secret_refuses_to_open(kind: StoreKind) -> None:
    """Operations but no secret: `open` raises, naming the lost secret, and makes none."""
    make, forget_secret = kind
    store = make()
    await store.open()
    first_secret = await store.scope_secret()
    claimed = await store.claim(claim_request("k1"))
    assert isinstance(claimed, NewAttempt)
    await store.close()
    await forget_secret()

    refused = make()
    with pytest.raises(StoreUnavailable, match="operations but no scope secret"):
        await refused.open()
    await refused.close()

    # Still refused the next time: the refusal wrote no secret of its own.
    again = make()
    with pytest.raises(StoreUnavailable, match="operations but no scope secret"):
        await again.open()
    await again.close()
    assert first_secret  # (the lost one; only a restore from a backup brings it back)


async def test_an_empty_store_without_a_secret_makes_one(kind: StoreKind) -> None:
    """No operations to protect: a missing secret is simply made, as on first start."""
    make, forget_secret = kind
    store = make()
    await store.open()
    await store.close()
    await forget_secret()

    reopened = make()
    await reopened.open()
    try:
        assert len(await reopened.scope_secret()) >= 32
    finally:
        await reopened.close()


async def test_a_gateway_on_such_a_store_exits_with_one_line(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """`serve` on a store whose secret is gone exits 1 with one line, and serves nothing."""
    gateway = spawn(processes, tmp_path, upstream.url)
    async with aiohttp.ClientSession() as session:
        answer = await session.post(
            f"{gateway.url}/tickets/v1/issues", data=b"{}", headers={"Idempotency-Key": "k1"}
        )
        assert answer.status == 201
    gateway.stop()
    with closing(sqlite3.connect(tmp_path / "gateway.db")) as connection, connection:
        connection.execute("DELETE FROM gateway_meta WHERE name = 'scope_secret'")

    result = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "gateway", "serve", "--config", str(gateway.config_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )

    assert result.returncode == 1, result.stdout + result.stderr
    assert "listening" not in result.stdout
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("idempotency-gateway: cannot start: the store holds operations but")
    assert upstream.count == 1
