"""A throwaway PostgreSQL schema for the gateway rows, or the reason there is none.

The same server the tests use (`tests/pg.py`); each run makes its own schema
and reaches it through the `search_path` DSN parameter, so a benchmark never
sees rows from an earlier run or from the tests, and leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import re
import secrets

import asyncpg

__all__ = ["PG_URL", "create_schema", "drop_schema", "server_version", "url_for"]

PG_URL = "postgresql://postgres@127.0.0.1:5432/test"
_SCHEMA_NAME = re.compile(r"bench_[0-9a-f]+")
_CONNECT_TIMEOUT = 3.0


def url_for(schema: str) -> str:
    """The store URL that puts the gateway's tables in `schema`."""
    return f"{PG_URL}?search_path={schema}"


def create_schema() -> str:
    """Create an empty schema `bench_<hex>` and return its name.

    Raises `OSError` or an asyncpg error when the server is unreachable; the
    caller skips the PostgreSQL rows with that reason.
    """
    name = f"bench_{secrets.token_hex(6)}"
    asyncio.run(_execute(f"CREATE SCHEMA {name}"))
    return name


def drop_schema(name: str) -> None:
    """Drop a schema made by `create_schema`, with everything in it."""
    if not _SCHEMA_NAME.fullmatch(name):
        raise ValueError(f"not a benchmark schema: {name!r}")
    asyncio.run(_execute(f"DROP SCHEMA IF EXISTS {name} CASCADE"))


def server_version() -> str:
    """The server's version, e.g. "15.8", for the results' notes."""
    return asyncio.run(_fetch_version())


async def _fetch_version() -> str:
    connection = await asyncpg.connect(PG_URL, timeout=_CONNECT_TIMEOUT)
    try:
        return str(await connection.fetchval("SHOW server_version"))
    finally:
        await connection.close()


async def _execute(statement: str) -> None:
    connection = await asyncpg.connect(PG_URL, timeout=_CONNECT_TIMEOUT)
    try:
        await connection.execute(statement)
    finally:
        await connection.close()
