"""The PostgreSQL schema, its versioned migrations, and the column list the store reads.

Migrations run under a transaction-scoped advisory lock, so replicas that
start together take turns: the first migrates, the others find the schema
current. Times are `timestamptz` (readable by operators with plain SQL); the
store reads them back as POSIX seconds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.store.rows import COLUMN_NAMES

if TYPE_CHECKING:
    import asyncpg
    import asyncpg.pool

SCHEMA_VERSION = 6

MIGRATION_LOCK = 0x1DE4_6A7E
"""Advisory lock key for migrations (any constant shared by all replicas)."""

NOTIFY_CHANNEL = "idempotency_gateway_settled"
"""Outcome writes notify this channel with the operation id, for `Prefer: wait` across replicas."""

_TIME_COLUMNS = frozenset(
    {
        "created_at",
        "updated_at",
        "lease_expires_at",
        "sent_at",
        "expires_at",
        "forgotten_at",
        "resolution_at",
    }
)


OBSERVED_AT = "extract(epoch from clock_timestamp())::float8 AS observed_at"
"""The database's clock as each row is read or written: `Operation.observed_at`."""


def columns_of(table: str = "") -> str:
    """The select list, times as POSIX seconds, in the order `row_to_operation` reads.

    `table` qualifies every column (`o.id`), for statements that join another
    relation with columns of the same names.
    """
    prefix = f"{table}." if table else ""
    return ", ".join(
        OBSERVED_AT
        if name == "observed_at"
        else f"extract(epoch from {prefix}{name})::float8 AS {name}"
        if name in _TIME_COLUMNS
        else f"{prefix}{name} AS {name}"
        if prefix
        else name
        for name in COLUMN_NAMES
    )


COLUMNS = columns_of()
"""The select list, times as POSIX seconds, in the order `row_to_operation` reads."""

_MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        """
        CREATE TABLE gateway_meta (
            name text PRIMARY KEY,
            value bytea NOT NULL
        )
        """,
        """
        CREATE TABLE operations (
            seq bigserial PRIMARY KEY,
            id text NOT NULL UNIQUE,
            scope text NOT NULL,
            key text NOT NULL,
            state text NOT NULL
                CHECK (state IN ('in_flight', 'completed', 'unknown', 'released')),
            route text NOT NULL,
            method text NOT NULL,
            path text NOT NULL,
            fingerprint text NOT NULL,
            attempts integer NOT NULL,
            token bigint NOT NULL,
            version bigint NOT NULL,
            created_at timestamptz NOT NULL,
            updated_at timestamptz NOT NULL,
            lease_owner text,
            lease_expires_at timestamptz,
            sent_at timestamptz,
            response_status integer,
            response_headers text,
            response_body bytea,
            body_retained boolean NOT NULL DEFAULT true,
            expires_at timestamptz,
            forgotten_at timestamptz,
            resolution_by text,
            resolution_at timestamptz,
            resolution_note text,
            evidence jsonb NOT NULL DEFAULT '[]'::jsonb,
            UNIQUE (scope, key)
        )
        """,
        "CREATE INDEX operations_by_state ON operations (state, seq)",
        "CREATE INDEX operations_by_forgotten_at ON operations (forgotten_at) "
        "WHERE forgotten_at IS NOT NULL",
        "CREATE INDEX operations_by_lease ON operations (lease_expires_at) "
        "WHERE state = 'in_flight'",
    ),
    # The sweep finds expired receipt bodies without scanning every completed row.
    2: (
        "CREATE INDEX operations_by_body_expiry ON operations (expires_at) "
        "WHERE response_body IS NOT NULL",
    ),
    # Outcome writes NOTIFY only rows a waiting replica asked about (a constant
    # default: no table rewrite).
    3: ("ALTER TABLE operations ADD COLUMN watched boolean NOT NULL DEFAULT false",),
    # How each receipt is kept, said by the row (gateway.store.rows.seal_receipt). Rows
    # from before carry no marker: those whose body starts with the envelope's magic
    # were sealed by the old code, the one time bytes decide.
    4: (
        "ALTER TABLE operations ADD COLUMN storage text NOT NULL DEFAULT 'plain'",
        "UPDATE operations SET storage = 'sealed' "
        "WHERE substring(response_body from 1 for 4) = '\\x49474531'::bytea",
    ),
    # The history (gateway.engine.history): events in their own table, the chain's
    # head in the row; `request_kept` marks rows whose recorded request the sweep
    # must drop at `expires_at`. Existing rows get a reconstructed history (below).
    5: (
        "ALTER TABLE operations ADD COLUMN history_seq integer NOT NULL DEFAULT 0",
        "ALTER TABLE operations ADD COLUMN history_head text NOT NULL DEFAULT ''",
        "ALTER TABLE operations ADD COLUMN request_kept boolean NOT NULL DEFAULT false",
        """
        CREATE TABLE operation_events (
            operation_id text NOT NULL,
            seq integer NOT NULL,
            type text NOT NULL,
            at_us bigint NOT NULL,
            actor text NOT NULL,
            version bigint NOT NULL,
            data text NOT NULL,
            payload bytea,
            storage text NOT NULL DEFAULT 'plain',
            prev text NOT NULL,
            hash text NOT NULL,
            PRIMARY KEY (operation_id, seq)
        )
        """,
        "CREATE INDEX operations_by_request_expiry ON operations (expires_at) WHERE request_kept",
    ),
    # The hot path's receipts chain their events in the statement that writes them
    # (`gateway.store.postgres_statements._COMPLETES`): the database computes the
    # digest `gateway.engine.history.event_hash` computes, from the same canonical form
    # (an HMAC given the key's inner and outer pads, as RFC 2104 builds it).
    6: (
        """
        CREATE FUNCTION gateway_event_hash(
            actor text, at_us bigint, data text, prev text, seq integer, type text,
            version bigint, inner_pad bytea, outer_pad bytea
        ) RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
            SELECT CASE WHEN inner_pad IS NULL THEN encode(sha256(form), 'hex')
                   ELSE 'hmac:' || encode(sha256(outer_pad || sha256(inner_pad || form)), 'hex')
                   END
            FROM (SELECT convert_to(
                '{"actor":' || to_json(actor)::text || ',"at":' || at_us
                || ',"data":' || data || ',"prev":' || to_json(prev)::text
                || ',"seq":' || seq || ',"type":' || to_json(type)::text
                || ',"version":' || version || '}', 'UTF8') AS form) AS canonical
        $$
        """,
    ),
}


async def _reconstruct_histories(
    connection: asyncpg.pool.PoolConnectionProxy[asyncpg.Record],
) -> None:
    """Version 5: every operation recorded before gets the history its row proves."""
    from gateway.store.history_migration import reconstructed_rows
    from gateway.store.history_rows import EVENT_COLUMNS
    from gateway.store.rows import row_to_operation

    for row in await connection.fetch(f"SELECT {COLUMNS} FROM operations"):
        operation = row_to_operation(row, lenient=True)
        events, head, seq = reconstructed_rows(operation)
        await connection.executemany(
            f"INSERT INTO operation_events ({EVENT_COLUMNS}) "
            "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'plain', $9, $10)",
            [tuple(event) for event in events],
        )
        await connection.execute(
            "UPDATE operations SET history_head = $2, history_seq = $3 WHERE id = $1",
            operation.id,
            head,
            seq,
        )


_PYTHON_STEPS = {5: _reconstruct_histories}


async def migrate(connection: asyncpg.pool.PoolConnectionProxy[asyncpg.Record]) -> int:
    """Bring the schema to `SCHEMA_VERSION`; safe when several replicas start at once."""
    async with connection.transaction():
        await connection.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK)
        await connection.execute(
            "CREATE TABLE IF NOT EXISTS gateway_schema_version (version integer NOT NULL)"
        )
        current = await connection.fetchval("SELECT version FROM gateway_schema_version")
        if current is not None and current > SCHEMA_VERSION:
            raise RuntimeError(
                f"the database schema is version {current}, newer than this gateway "
                f"({SCHEMA_VERSION}): upgrade the gateway"
            )
        for version in range((current or 0) + 1, SCHEMA_VERSION + 1):
            for statement in _MIGRATIONS[version]:
                await connection.execute(statement)
            step = _PYTHON_STEPS.get(version)
            if step is not None:
                await step(connection)
        if current is None:
            await connection.execute(
                "INSERT INTO gateway_schema_version (version) VALUES ($1)", SCHEMA_VERSION
            )
        elif current < SCHEMA_VERSION:
            await connection.execute(
                "UPDATE gateway_schema_version SET version = $1", SCHEMA_VERSION
            )
    return SCHEMA_VERSION
