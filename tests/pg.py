"""The PostgreSQL server the tests use, and a throwaway schema per test.

Each test gets its own schema (`t_<hex>`) and reaches it through the
`search_path` DSN parameter, which asyncpg passes to the server as a setting,
so tests never see each other's rows and need no cleanup beyond a
`DROP SCHEMA ... CASCADE`.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import re
import secrets
import socket
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, NoReturn

import asyncpg
import pytest

from gateway.engine.models import ClaimRequest

if TYPE_CHECKING:
    from gateway.store.postgres import PostgresStore

PG_HOST = "127.0.0.1"
PG_PORT = 5432
PG_URL = f"postgresql://postgres@{PG_HOST}:{PG_PORT}/test"

_SCHEMA_NAME = re.compile(r"t_[0-9a-f]+")


def claim_request(key: str, *, path: str = "/r") -> ClaimRequest:
    """A claim of `key` in scope "s" for the PostgreSQL-only tests."""
    return ClaimRequest(
        scope="s",
        key=key,
        fingerprint="f",
        route="r",
        method="POST",
        path=path,
        owner="o",
        lease_seconds=30,
        tombstone_seconds=600,
    )


def url_for(schema: str) -> str:
    """The DSN that puts a connection in `schema`."""
    return f"{PG_URL}?search_path={schema}"


async def fresh_schema() -> str:
    """Create an empty schema with a random name and return the name."""
    name = f"t_{secrets.token_hex(8)}"
    connection = await asyncpg.connect(PG_URL)
    try:
        await connection.execute(f"CREATE SCHEMA {name}")
    finally:
        await connection.close()
    return name


async def drop_schema(name: str) -> None:
    """Drop a schema made by `fresh_schema`, with everything in it."""
    if not _SCHEMA_NAME.fullmatch(name):
        raise ValueError(f"not a test schema: {name!r}")
    connection = await asyncpg.connect(PG_URL)
    try:
        await connection.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")
    finally:
        await connection.close()


def require_postgres() -> type[PostgresStore]:
    """`PostgresStore`, or skip the test when it or the server is missing.

    In CI (`CI=true`) a missing PostgreSQL fails the test instead: CI must not
    pass while silently skipping every PostgreSQL case.
    """
    try:
        from gateway.store.postgres import PostgresStore
    except ImportError as exc:
        _unavailable(f"gateway.store.postgres cannot be imported: {exc}")
    try:
        with socket.create_connection((PG_HOST, PG_PORT), timeout=1.0):
            pass
    except OSError as exc:
        _unavailable(f"no PostgreSQL server on {PG_HOST}:{PG_PORT}: {exc}")
    return PostgresStore


def _unavailable(reason: str) -> NoReturn:
    if os.environ.get("CI") == "true":
        pytest.fail(f"PostgreSQL is required in CI: {reason}")
    pytest.skip(reason)


CATALOGS = (
    "pg_attribute",
    "pg_class",
    "pg_depend",
    "pg_index",
    "pg_type",
    "pg_constraint",
    "pg_inherits",
    "pg_attrdef",
    "pg_trigger",
    "pg_description",
    "pg_statistic",
    "pg_namespace",
)
"""The system catalogs that every schema a test makes and drops leaves dead rows in."""


def vacuum_catalogs() -> None:
    """Rewrite the test database's catalogs compact (`VACUUM FULL`), where the server is up
    (a no-op otherwise). Run before any test touches the server: it locks them meanwhile.

    Each PostgreSQL test makes a schema of some fifty tables and drops it: a run leaves
    hundreds of thousands of dead catalog rows. The servers of CI machines may run
    without autovacuum (one here has `autovacuum = off`), and then every run's DDL and
    catalog lookups got slower than the last: after a day of runs pg_attribute held 1.9
    million dead rows in 406 MB, and a clean clone's `make test` took 6:32 after a plain
    VACUUM (the files stay that big) and 5:58 after VACUUM FULL (816 kB), the runs
    before them 6:11 to 6:54. Compacting a run's leftovers takes under a second."""

    async def vacuum() -> None:
        connection = await asyncpg.connect(PG_URL, timeout=1.0)
        try:
            await connection.execute(f"VACUUM FULL {', '.join(CATALOGS)}")
        finally:
            await connection.close()

    try:
        asyncio.run(vacuum())
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError):
        return  # no server, or a refusal: the PostgreSQL tests each say what is wrong


_SERVER_LOCK = Path(tempfile.gettempdir()) / "idempotency-gateway-tests-postgres.lock"
"""Shared by every test on the server while it runs, taken exclusively by the one test that
restarts the server: pytest-xdist workers are processes, so the lock is a file's flock."""
_TURNSTILE = Path(tempfile.gettempdir()) / "idempotency-gateway-tests-postgres.turnstile"
"""Passed through (shared) by every test on its way onto the server, and closed (exclusive) by
the test waiting to restart it: a flock waiting for exclusive use does not stop new shared
holders, so without it five workers' tests, overlapping, keep the restart waiting for good."""
_held: IO[bytes] | None = None
_closed_turnstile: IO[bytes] | None = None


@asynccontextmanager
async def schema_url() -> AsyncIterator[str]:
    """The URL of a fresh schema on the test server (skips or fails when it is down, as
    `require_postgres` does), dropped afterwards."""
    require_postgres()
    schema = await fresh_schema()
    try:
        yield url_for(schema)
    finally:
        await drop_schema(schema)


@contextmanager
def server_in_use() -> Iterator[None]:
    """Hold the server for this test (shared: other tests on it run alongside)."""
    global _held, _closed_turnstile
    handle = _SERVER_LOCK.open("ab")
    with _TURNSTILE.open("ab") as turnstile:
        fcntl.flock(turnstile.fileno(), fcntl.LOCK_SH)  # waits while a restart waits
        fcntl.flock(handle.fileno(), fcntl.LOCK_SH)
    _held = handle
    try:
        yield
    finally:
        _held = None
        handle.close()  # closing drops the flock
        if _closed_turnstile is not None:  # the test ended before `share_again`
            _closed_turnstile.close()
            _closed_turnstile = None


def restart_alone() -> None:
    """Wait until no test in another worker is on the server, and keep it so until
    `share_again` (or this test's end): only then may the server be restarted under it."""
    global _closed_turnstile
    if _held is None:
        raise RuntimeError("restart_alone() needs the test's postgres marker (server_in_use)")
    turnstile = _TURNSTILE.open("ab")
    fcntl.flock(turnstile.fileno(), fcntl.LOCK_EX)  # no other test goes onto the server now
    _closed_turnstile = turnstile
    fcntl.flock(_held.fileno(), fcntl.LOCK_EX)  # and the ones on it have left


def share_again() -> None:
    """After `restart_alone`, once the server is back: other workers' tests may use it again
    (every other PostgreSQL test waits while this one holds it alone)."""
    global _closed_turnstile
    if _held is None:
        raise RuntimeError("share_again() needs the test's postgres marker (server_in_use)")
    fcntl.flock(_held.fileno(), fcntl.LOCK_SH)
    if _closed_turnstile is not None:
        _closed_turnstile.close()
        _closed_turnstile = None
