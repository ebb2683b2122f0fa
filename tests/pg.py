"""The PostgreSQL server the tests use, and a throwaway schema per test.

Each test gets its own schema (`t_<hex>`) and reaches it through the
`search_path` DSN parameter, which asyncpg passes to the server as a setting,
so tests never see each other's rows and need no cleanup beyond a
`DROP SCHEMA ... CASCADE`.
"""

from __future__ import annotations

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


_SERVER_LOCK = Path(tempfile.gettempdir()) / "idempotency-gateway-tests-postgres.lock"
"""Shared by every test on the server while it runs, taken exclusively by the one test that
restarts the server: pytest-xdist workers are processes, so the lock is a file's flock."""
_held: IO[bytes] | None = None


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
    global _held
    handle = _SERVER_LOCK.open("ab")
    fcntl.flock(handle.fileno(), fcntl.LOCK_SH)
    _held = handle
    try:
        yield
    finally:
        _held = None
        handle.close()  # closing drops the flock


def restart_alone() -> None:
    """Wait until no test in another worker is on the server, and keep it so until this
    test ends: only then may the server be restarted under it."""
    if _held is None:
        raise RuntimeError("restart_alone() needs the test's postgres marker (server_in_use)")
    fcntl.flock(_held.fileno(), fcntl.LOCK_EX)
