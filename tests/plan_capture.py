"""What a store ran and how its database planned it: for the query-plan tests.

A statement that reads a big table by scanning it costs nothing at a thousand
rows and seconds at ten million, and no functional test notices. These
helpers record every statement a gateway's store runs, with the plan its
database chose, so a test can refuse a scan of a big table:

- SQLite: each connection's trace callback gives the statement with its
  values bound; `EXPLAIN QUERY PLAN` of that text on the same file gives its plan
  (SQLite keeps no statistics unless told to, and the gateway does not, so the
  plan is the one production gets at any size).
- PostgreSQL: `auto_explain` (a contrib module shipped with the server) logs
  the plan each statement ran with, nested ones inside the claims function
  included, and `client_min_messages = log` sends that log to the session
  that ran it, where a log listener collects it. `plan_cache_mode =
  force_generic_plan` makes every prepared statement use the plan it would
  settle on after five runs: the one that once scanned a whole table per claim.
  The plans are logged with what they did (`log_analyze`): an index walked in
  `seq` order that filters out every row has no Seq Scan node, but its
  "Rows Removed by Filter" tells.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import pytest

BIG_TABLES = frozenset(
    {
        "operations",
        "operation_events",
        "request_log",
        "request_counts",
        "similar_refusals",
        "history_checkpoints",
        "history_keyed_since",
        "operation_keys",
    }
)
"""Tables that grow with the operations stored (a partition of one counts as it)."""

_PARTITION = re.compile(r"^(?P<table>[a-z_]+?)_(p\d{8}|before_v\d+|legacy|default)$")
_FIRST_ROW_ONLY = re.compile(r"^INSERT INTO gateway_meta .*EXISTS \(SELECT 1 FROM operations\)")
"""The start-up notes (`scope_secret`, `*_since`) ask whether any operation exists: an
EXISTS with no condition, which reads one row whatever its plan says."""
_SKIPPED = ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE", "PRAGMA", "--", "ANALYZE")


def big_table(name: str) -> bool:
    """Whether relation `name` is a big table or a partition of one."""
    match = _PARTITION.match(name)
    return name in BIG_TABLES or (match is not None and match["table"] in BIG_TABLES)


@dataclass
class Scans:
    """Statements whose plans scan a big table, with the scan's line."""

    found: list[tuple[str, str]] = field(default_factory=list)
    statements: int = 0

    def report(self) -> str:
        return "\n\n".join(f"{line}\n  in: {sql[:600]}" for sql, line in self.found)


# -- SQLite -----------------------------------------------------------------------


Statement = tuple[str, Any]
"""An SQL text and the parameters it ran with (a sequence or a mapping)."""


class _RecordingConnection(sqlite3.Connection):
    """A connection that notes every statement it runs with its parameters."""

    seen: list[Statement]

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        self.seen.append((sql, parameters))
        return super().execute(sql, parameters)

    def executemany(self, sql: str, parameters: Any, /) -> sqlite3.Cursor:
        rows = list(parameters)
        if rows:
            self.seen.append((sql, rows[0]))
        return super().executemany(sql, rows)


@contextmanager
def sqlite_statements(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Statement]]:
    """Every statement run on an SQLite connection opened while inside, with its
    parameters: the plan of a statement with parameters can differ from the plan of
    its text with the values written in (SQLite plans constants it can compare)."""
    seen: list[Statement] = []
    connect = sqlite3.connect

    def recording(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        connection = connect(*args, factory=_RecordingConnection, **kwargs)
        connection.seen = seen  # type: ignore[attr-defined]
        return connection

    with monkeypatch.context() as patch:
        patch.setattr(sqlite3, "connect", recording)
        yield seen


def sqlite_scans(path: str, statements: list[Statement], *, rows: int) -> Scans:
    """The statements among `statements` that read a big table of the file at `path`
    (holding `rows` operations) from end to end.

    Two signs, either enough: the plan says `SCAN` of a big table (but for the
    start-up notes' `EXISTS`, which stops at the first row), or a read runs
    at least one SQLite instruction per two stored operations (a walk in rowid
    order that filters every row is a `SEARCH` by its plan, and a scan by its cost;
    an index lookup runs a few hundred instructions, whatever the size).
    """
    scans = Scans()
    connection = sqlite3.connect(path)
    connection.create_function("gateway_now", 0, lambda: 0.0)
    connection.create_function("gateway_settled", 1, lambda _id: None)
    first: dict[str, Any] = {}
    for sql, parameters in statements:  # each distinct text once, with its first parameters
        first.setdefault(sql, parameters)
    try:
        for sql, parameters in first.items():
            if sql.lstrip().upper().startswith(_SKIPPED):
                continue
            scans.statements += 1
            for row in connection.execute("EXPLAIN QUERY PLAN " + sql, parameters):
                detail = str(row[-1])
                words = detail.split()
                if (
                    len(words) >= 2
                    and words[0] == "SCAN"
                    and big_table(words[1])
                    and not _FIRST_ROW_ONLY.search(sql)
                ):
                    scans.found.append((sql, detail))
            if sql.lstrip().upper().startswith(("SELECT", "WITH")):
                instructions = _instructions(connection, sql, parameters)
                if instructions * 2 >= rows:
                    scans.found.append((sql, f"{instructions:,} instructions for {rows:,} rows"))
    finally:
        connection.close()
    return scans


def _instructions(connection: sqlite3.Connection, sql: str, parameters: Any) -> int:
    """Virtual-machine instructions SQLite ran to read every row of `sql` (to the hundred)."""
    count = 0

    def tick() -> int:
        nonlocal count
        count += 100
        return 0

    connection.set_progress_handler(tick, 100)
    try:
        connection.execute(sql, parameters).fetchall()
    finally:
        connection.set_progress_handler(None, 0)
    return count


# -- PostgreSQL -------------------------------------------------------------------

PLAN_SETTINGS = {
    "session_preload_libraries": "auto_explain",
    "auto_explain.log_min_duration": "0",
    "auto_explain.log_nested_statements": "on",
    "auto_explain.log_format": "json",
    "auto_explain.log_analyze": "on",
    "auto_explain.log_timing": "off",
    "client_min_messages": "log",
    "plan_cache_mode": "force_generic_plan",
}
"""Server settings (asyncpg passes unknown URL parameters as such) that send the plan of
every statement a session runs to that session."""


def explained_url(url: str) -> str:
    """`url` with `PLAN_SETTINGS` added to its parameters."""
    return url + ("&" if "?" in url else "?") + urlencode(PLAN_SETTINGS)


@contextmanager
def postgres_plans(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    """The plan (auto_explain's JSON) of every statement run on a pool made while inside."""
    import asyncpg

    plans: list[dict[str, Any]] = []
    create_pool = asyncpg.create_pool

    def listen(_connection: Any, message: Any) -> None:
        text = str(getattr(message, "message", ""))
        head, _, body = text.partition("plan:")
        if head.startswith("duration:") and body.strip():
            plans.append(json.loads(body))

    async def setup(connection: Any) -> None:
        # asyncpg drops a connection's log listeners when it goes back to the pool
        # (with a warning): add it again at every acquire.
        connection.add_log_listener(listen)

    def pooled(*args: Any, **kwargs: Any) -> Any:
        outer: Callable[[Any], Any] | None = kwargs.pop("setup", None)

        async def both(connection: Any) -> None:
            await setup(connection)
            if outer is not None:
                await outer(connection)

        return create_pool(*args, setup=both, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(asyncpg, "create_pool", pooled)
        yield plans


SMALL_PAGES = 128
"""Pages (1 MiB) under which a relation is small: reading it through costs about what a
few probes of an index do, and the planner rightly scans it. Measured on a fill of
20,000: it scanned day partitions of up to 38 pages (738 events) and probed those of
27 pages and more, by the width of their rows; 128 leaves a margin over both."""


async def small_tables(url: str) -> frozenset[str]:
    """The tables of `url`'s schema under `SMALL_PAGES`: days' partitions made ahead (empty),
    the day that has just begun, the sliver of the day before yesterday a fill leaves.

    The planner sees their size: it may scan such a partition, and once it grows,
    autovacuum's ANALYZE invalidates the plans that read it, and the next plan is
    checked like the others. A fill of 20,000 puts thousands of pages in its bulk day,
    so a plan that scans whatever the size is still caught there.
    """
    import asyncpg

    connection = await asyncpg.connect(url)
    try:
        names = await connection.fetch(
            "SELECT relname FROM pg_class WHERE relkind = 'r' "
            "AND relnamespace = current_schema()::regnamespace "
            "AND pg_relation_size(oid) < $1 * current_setting('block_size')::int",
            SMALL_PAGES,
        )
        return frozenset(str(row["relname"]) for row in names)
    finally:
        await connection.close()


def postgres_scans(
    plans: list[dict[str, Any]], small: frozenset[str] = frozenset(), *, rows: int
) -> Scans:
    """The plans among `plans` that read a big table (of about `rows` operations) through.

    Two signs, either enough: a sequential scan of a big table (not one of `small`),
    or any scan of one that read and filtered out at least half as many rows as the
    store holds operations (an index walked in the wrong order).
    """
    scans = Scans()
    for document in plans:
        scans.statements += 1
        text = str(document.get("Query Text", ""))
        if _FIRST_ROW_ONLY.search(text):
            continue  # a start-up note: one row read, whatever its plan
        for node in _nodes(document.get("Plan", {})):
            relation = str(node.get("Relation Name", ""))
            if (
                node.get("Node Type") == "Seq Scan"
                and big_table(relation)
                and relation not in small
            ):
                scans.found.append((text, f"Seq Scan on {relation}"))
            removed = _removed(node)
            if big_table(relation) and removed >= rows / 2:
                scans.found.append((text, f"{removed} rows filtered out of {relation}"))
    return scans


def _removed(node: dict[str, Any]) -> int:
    """Rows a node read and dropped, over all its loops (EXPLAIN gives them per loop)."""
    per_loop = sum(
        float(node.get(field, 0))
        for field in ("Rows Removed by Filter", "Rows Removed by Index Recheck")
    )
    return round(per_loop * float(node.get("Actual Loops", 1)))


def _nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", ()):
        yield from _nodes(child)
