"""The admin search by prefix (`?q=`) on PostgreSQL: index ranges of the key table.

`?q=run-77` asks for the operations whose key (in any scope) or id starts with
`run-77`. Written as `key LIKE 'run-77%' OR id LIKE ...` and walked in `seq`
order, it reads every operation when few match (1.5 s at a million). The key
table's unique indexes cannot serve it: they sort in the database's collation,
where the texts that start with a prefix need not be one range (under
`en_US`, `-` and `_` weigh nothing at the first level), and LIKE reaches an
index only with a pattern written in the statement, never with a parameter
of a generic plan.

So `operation_keys` gets two more indexes in `text_pattern_ops` (byte order,
whatever the collation), and the search reads the ranges `~>=~ prefix` and
`~<~ prefix || U+10FFFF` (every key and id is made of characters below it),
`starts_with` keeping the answer exact: the cost is the rows that match.
Where more than `WALK_FROM` match (`op_01` matches every id), walking `seq`
order finds a page sooner, as before.

The indexes are built by one replica at a time (a try-lock: a replica that
finds another at it looks again later): in line at open while the key table
is small (a new store: a plain `CREATE INDEX`, milliseconds), and otherwise in
the background by `CREATE INDEX CONCURRENTLY` (reads and writes go on). No
schema version changes: a replica of the previous version neither needs nor
minds them. Until both are
valid, and the backfill of migration 12 is done (an operation from before may
have no key row yet), the search walks as before.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeAlias

import asyncpg

from gateway.store.background import BackgroundJob
from gateway.store.postgres_migration12 import backfilled

if TYPE_CHECKING:
    import asyncpg.pool

    Connection: TypeAlias = asyncpg.pool.PoolConnectionProxy[asyncpg.Record]

log = logging.getLogger("gateway.store.postgres")

INDEXES = {
    "operation_keys_key_prefix": "operation_keys (key text_pattern_ops)",
    "operation_keys_id_prefix": "operation_keys (id text_pattern_ops)",
}
"""Index name -> what it indexes: both ranges of `MATCHING`."""

BUILD_LOCK = 0x1DE4_6A82
"""Session advisory lock (try), with the schema's `hashtext` (`LOCK_OF_SCHEMA`): one
replica of a store builds its indexes at a time."""

LOCK_OF_SCHEMA = "$1::int4, hashtext(current_schema())"
"""The arguments of `pg_try_advisory_lock` for `BUILD_LOCK` ($1) in this store's schema."""

IN_LINE_BELOW = 100_000
"""Key rows (the planner's estimate) below which open builds the indexes before serving."""

WALK_FROM = 10_000
"""Matches above which a search walks the operations in `seq` order instead of reading the
ranges: the ranges cost the rows they match (sorted for the page), the walk the rows it
passes before it has a page, few when matches are dense."""

RETRY = 5.0
"""Seconds before a build that failed, or found another replica at it, looks again."""

_FAILURES = (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, asyncio.TimeoutError)

_IN_RANGES = (
    "SELECT k.id, k.created_at FROM operation_keys k "
    "WHERE k.key ~>=~ {low} AND k.key ~<~ {high} AND starts_with(k.key, {low}) "
    "UNION "
    "SELECT k.id, k.created_at FROM operation_keys k "
    "WHERE k.id ~>=~ {low} AND k.id ~<~ {high} AND starts_with(k.id, {low})"
)

MATCHING = "(id, created_at) IN ({ranges}) AND (starts_with(key, {low}) OR starts_with(id, {low}))"
"""`WHERE` condition on `operations`: key or id starts with `{low}`, read through the key
table's prefix indexes (`{high}` is `upper_bound(low)`); the pair prunes to partitions."""

COUNT = f"SELECT count(*) FROM ({_IN_RANGES.format(low='$1', high='$2')} LIMIT $3) matches"
"""How many operations match prefix $1 (bound $2), counting up to $3 at most."""


def matching(low: str, high: str) -> str:
    """`MATCHING` with its two parameters' placeholders (`$6`, say) written in."""
    return MATCHING.format(ranges=_IN_RANGES.format(low=low, high=high), low=low)


def upper_bound(prefix: str) -> str:
    """The least text above every text that starts with `prefix` (in byte order, of
    characters below U+10FFFF).

    >>> "abc" < "abc-def" < upper_bound("abc") < "abd"
    True
    """
    return prefix + "\U0010ffff"


class PrefixIndexes:
    """The prefix indexes of one store's key table (`pool` gives its pool once open)."""

    def __init__(self, url: str, pool: Callable[[], asyncpg.Pool]) -> None:
        self._url = url
        self._pool = pool
        self._ready = False
        self._build = BackgroundJob(self._run, "postgres-prefix-indexes")

    async def opened(self) -> None:
        """At open: built in line on a small key table, else started in the background."""
        async with self._pool().acquire() as connection:
            if await _valid(connection):
                return
            small = await connection.fetchval(
                "SELECT reltuples < $1 FROM pg_class WHERE oid = to_regclass('operation_keys')",
                IN_LINE_BELOW,
            )
        if small and await _build_once(self._url, concurrently=False):
            return
        self._build.start()

    async def ready(self) -> bool:
        """Whether the search may read the ranges: both indexes valid, the backfill done.
        Once true it stays true (asked again only until then)."""
        if not self._ready:
            async with self._pool().acquire() as connection:
                valid = await _valid(connection)
                self._ready = valid and await backfilled(connection)
            # A build only for indexes missing or invalid, not for a backfill still going.
            if not valid:
                self._build.start()
        return self._ready

    async def wait_built(self) -> None:
        """Until the background build this store runs has finished (tests)."""
        await self._build.wait()

    async def close(self) -> None:
        await self._build.close()

    async def _run(self) -> None:
        while True:
            try:
                if await _build_once(self._url, concurrently=True):
                    return
            except _FAILURES as exc:
                log.warning("postgres prefix indexes not built yet (trying again): %s", exc)
            await asyncio.sleep(RETRY)


async def _valid(connection: Connection) -> bool:
    valid = await connection.fetchval(
        "SELECT count(*) FROM pg_index WHERE indisvalid "
        "AND indexrelid = ANY(ARRAY[to_regclass($1), to_regclass($2)]::oid[])",
        *INDEXES,
    )
    return int(valid) == len(INDEXES)


async def _build_once(url: str, *, concurrently: bool) -> bool:
    """Build what is missing on a connection of its own (a concurrent build runs outside
    any transaction); False when another replica holds the build lock.

    A small table's build is a plain one: it blocks the table's writes for milliseconds,
    where a concurrent build waits for every transaction of the database that holds an
    older snapshot (a replica's start would wait for someone's long report)."""
    how = " CONCURRENTLY" if concurrently else ""
    connection = await asyncpg.connect(url, command_timeout=None)
    try:
        if not await connection.fetchval(
            f"SELECT pg_try_advisory_lock({LOCK_OF_SCHEMA})", BUILD_LOCK
        ):
            return False
        for name, what in INDEXES.items():
            valid = await connection.fetchval(
                "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1)", name
            )
            if valid is False:  # a build that stopped half-way leaves an invalid index
                await connection.execute(f"DROP INDEX{how} {name}")
            if valid is not True:
                log.info("postgres: building index %s%s", name, how.lower())
                await connection.execute(f"CREATE INDEX{how} {name} ON {what}")
        return True
    finally:
        await connection.close()  # the session lock goes with the session
