"""How a statement finds an operation's one partition: through the key table.

Since schema version 12 `operations` and `operation_events` are partitioned by
day (`gateway.store.postgres_partitions`), and uniqueness lives in
`operation_keys` (unpartitioned): (scope, key) -> operation id and creation time,
with a unique index on each of (scope, key) and id. The operation id is a ULID
whose time is the gateway's clock, while `created_at` is the database's: the
partition is never derived from the id, always read from this table.

Until the backfill of migration 12 is done (`BACKFILLED` in `gateway_meta`), an
operation recorded before the migration may have no row here yet: it lives in
the partition from before partitioning, which ends at `gateway_legacy_before()`.
The fragments below then look there too (`gateway_legacy_from()` and
`gateway_legacy_until()` are NULL once the backfill is done, so the fallback costs
nothing afterwards).

Each fragment compares the partition key with an init plan (a scalar subquery)
or a join column, so PostgreSQL prunes at run time to the one partition that can
hold the row ("Subplans Removed" or "(never executed)" in EXPLAIN ANALYZE); an
operation whose key row is gone (forgotten, or its partition being dropped) is
found nowhere.
"""

from __future__ import annotations

BACKFILLED = "partitions_backfilled"
"""The `gateway_meta` row that says every operation from before partitioning has its key row."""

LEGACY_BEFORE = "partitions_legacy_before"
"""The `gateway_meta` row naming (for operators) where the partition from before ends."""

_CREATED_OF_ID = "(SELECT k.created_at FROM operation_keys k WHERE k.id = {0})"
_CREATED_OF_KEY = "(SELECT k.created_at FROM operation_keys k WHERE k.scope = {0} AND k.key = {1})"


def _span(created: str, prefix: str) -> str:
    return (
        f"{prefix}created_at BETWEEN coalesce({created}, gateway_legacy_from()) "
        f"AND coalesce({created}, gateway_legacy_until())"
    )


def op_span(operation_id: str, table: str = "") -> str:
    """`WHERE` condition: the row's `created_at` is the one of operation `operation_id`
    (an SQL expression), which prunes the scan to its partition.

    >>> op_span("$1").startswith("created_at BETWEEN coalesce((SELECT k.created_at")
    True
    """
    return _span(_CREATED_OF_ID.format(operation_id), f"{table}." if table else "")


def key_span(scope: str, key: str, table: str = "") -> str:
    """`WHERE` condition: the row's `created_at` is the one of the operation holding
    (scope, key), which prunes the scan to its partition."""
    return _span(_CREATED_OF_KEY.format(scope, key), f"{table}." if table else "")


def by_id(operation_id: str, table: str = "") -> str:
    """`WHERE` condition: the operation `operation_id`, read in its partition only."""
    prefix = f"{table}." if table else ""
    return f"{prefix}id = {operation_id} AND {op_span(operation_id, table)}"


def by_key(scope: str, key: str, table: str = "") -> str:
    """`WHERE` condition: the operation holding (scope, key), read in its partition only."""
    prefix = f"{table}." if table else ""
    return f"{prefix}scope = {scope} AND {prefix}key = {key} AND {key_span(scope, key, table)}"


def events_of(operation_id: str, table: str = "") -> str:
    """`WHERE` condition: events of operation `operation_id`, read in its events' partition.

    Events are partitioned by their operation's creation (`op_created_at`, as
    `gateway_event_key` files it: events of operations from before partitioning
    read `-infinity`, the default the migration gave the rows it found).
    """
    prefix = f"{table}." if table else ""
    created = _CREATED_OF_ID.format(operation_id)
    return (
        f"{prefix}operation_id = {operation_id} AND {prefix}op_created_at = "
        f"(SELECT gateway_event_key(coalesce({created}, gateway_legacy_from())))"
    )


def ids_span(ids: str, table: str = "") -> str:
    """`WHERE` condition for a batch (`ids`, an SQL text[] expression): `created_at`
    between the earliest and the latest of their operations', which prunes to the
    partitions they live in (one, for a batch of recent operations)."""
    prefix = f"{table}." if table else ""
    joined = f"FROM unnest({ids}) AS x(id) LEFT JOIN operation_keys k ON k.id = x.id"
    return (
        f"{prefix}created_at BETWEEN "
        f"(SELECT min(coalesce(k.created_at, gateway_legacy_from())) {joined}) "
        f"AND (SELECT max(coalesce(k.created_at, gateway_legacy_until())) {joined})"
    )


LEGACY_FUNCTIONS = (
    # Where the partition from before partitioning starts and ends while operations in it
    # may still lack their key row; NULL once the backfill is done.
    """
    CREATE OR REPLACE FUNCTION gateway_legacy_until() RETURNS timestamptz
    LANGUAGE sql STABLE PARALLEL SAFE AS $$
        SELECT gateway_legacy_before()
        WHERE NOT EXISTS (SELECT 1 FROM gateway_meta WHERE name = 'partitions_backfilled')
    $$
    """,
    """
    CREATE OR REPLACE FUNCTION gateway_legacy_from() RETURNS timestamptz
    LANGUAGE sql STABLE PARALLEL SAFE AS $$
        SELECT '-infinity'::timestamptz
        WHERE NOT EXISTS (SELECT 1 FROM gateway_meta WHERE name = 'partitions_backfilled')
    $$
    """,
    # The events partition key of an operation created at `created`.
    """
    CREATE OR REPLACE FUNCTION gateway_event_key(created timestamptz) RETURNS timestamptz
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
        SELECT CASE WHEN created < gateway_legacy_before() THEN '-infinity'::timestamptz
               ELSE created END
    $$
    """,
)
"""Functions the fragments use (`gateway_legacy_before()` is made by the migration, with
the instant it chose as a constant, so the planner folds it)."""


def legacy_before_function(instant: str) -> str:
    """`gateway_legacy_before()`: where the partition from before partitioning ends
    (`instant`, an SQL timestamptz literal; '-infinity' on a store that had none)."""
    return (
        "CREATE OR REPLACE FUNCTION gateway_legacy_before() RETURNS timestamptz "
        f"LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT {instant}::timestamptz $$"
    )


KEY_TABLE = (
    """
    CREATE TABLE operation_keys (
        scope text NOT NULL,
        key text NOT NULL,
        id text NOT NULL,
        created_at timestamptz NOT NULL,
        CONSTRAINT operation_keys_pkey PRIMARY KEY (scope, key) INCLUDE (id, created_at)
    )
    """,
    "CREATE UNIQUE INDEX operation_keys_by_id ON operation_keys (id) INCLUDE (created_at)",
)
"""The unpartitioned key table: (scope, key) is claimed here, once, whatever the partitions."""
