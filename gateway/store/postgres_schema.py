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

SCHEMA_VERSION = 12

_IN_ONE_TRANSACTION = 11
"""Versions up to this one migrate in one transaction; version 12 runs online, step by
step (`gateway.store.postgres_migration12`)."""

MIGRATION_LOCK = 0x1DE4_6A7E
"""Advisory lock key for migrations (any constant shared by all replicas)."""

REQUEST_LOCK_CLASS = 0x51A1
"""First key of the transaction advisory lock a claim takes on its request (scope, route,
fingerprint; the second key is a hash of the three): the two-key form, a key space apart
from `MIGRATION_LOCK`'s."""

REQUEST_LOCK_KEY = "hashtext({0} || chr(1) || {1} || chr(1) || {2})"
"""The second lock key, from SQL expressions of the scope, the route and the fingerprint."""

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
    # The same request under a new key: twins are found by request, a refused key's
    # binding to its twin is kept, and a batch of claims takes each request's lock
    # before the statement that checks and claims (`gateway_claims`: a function, so
    # that the statement's snapshot is taken after the locks, in one round trip).
    7: (
        "CREATE INDEX operations_by_request ON operations "
        "(fingerprint, scope, route, state, sent_at)",
        """
        CREATE TABLE similar_refusals (
            scope text NOT NULL,
            key text NOT NULL,
            fingerprint text NOT NULL,
            twin_id text NOT NULL,
            refused_at timestamptz NOT NULL,
            expires_at timestamptz NOT NULL,
            PRIMARY KEY (scope, key)
        )
        """,
        "CREATE INDEX similar_refusals_by_expiry ON similar_refusals (expires_at)",
    ),
    # A probe proves it can see (gateway.engine.calibration): each operation's request
    # kind, so that calibration finds a recent completed one of a kind, and the
    # calibration rows themselves. Fingerprints become version 2 (JSON compared as JSON):
    # where operations of the old form exist, the upgrade's time is kept, and twins and
    # refusal bindings are looked up by both forms (`legacies`) while the old ones may
    # still refuse. `gateway_claims` (made here, replacing version 7's) takes each
    # claim's kind and the old form of its fingerprint.
    8: (
        "ALTER TABLE operations ADD COLUMN request_kind text",
        "CREATE INDEX operations_by_kind ON operations (route, request_kind, scope, created_at) "
        "WHERE request_kind IS NOT NULL",
        """
        CREATE TABLE probe_calibrations (
            route text NOT NULL,
            kind text NOT NULL,
            state text NOT NULL CHECK (state IN ('calibrated', 'blind', 'trusted')),
            at timestamptz NOT NULL,
            sample text,
            detail text NOT NULL,
            until timestamptz,
            actor text,
            note text,
            events jsonb NOT NULL DEFAULT '[]'::jsonb,
            PRIMARY KEY (route, kind)
        )
        """,
        "INSERT INTO gateway_meta (name, value) SELECT 'fingerprint_v2_since', "
        "convert_to(extract(epoch from clock_timestamp())::text, 'UTF8') "
        "WHERE EXISTS (SELECT 1 FROM operations "
        "WHERE method <> 'tools/call' AND fingerprint LIKE 'sha256:%') "
        "ON CONFLICT (name) DO NOTHING",
        "DROP FUNCTION IF EXISTS gateway_claims(text[], text[], text[], text[], text[], text[], "
        "text[], text[], float8[], bool[], text[], text[], bytea[], text[], bytea, bytea, "
        "text[], float8[], bool[])",
        f"""
        CREATE FUNCTION gateway_claims(
            ids text[], scopes text[], keys text[], routes text[], methods text[],
            paths text[], fingerprints text[], owners text[], leases float8[], kept bool[],
            actors text[], datas text[], payloads bytea[], storages text[],
            inner_pad bytea, outer_pad bytea, guards text[], windows float8[], vouched bool[],
            kinds text[], legacies text[]
        ) RETURNS TABLE (op operations, kind text, for_id text)
        LANGUAGE plpgsql VOLATILE
        -- Its plans are cached for the session, from the statistics of the moment: made
        -- while the table was small they scanned it whole, per claim, ever after.
        SET enable_seqscan = off
        AS $$
        #variable_conflict use_column
        DECLARE
            request_key integer;
        BEGIN
            -- In order, so that two batches never wait for each other's locks.
            FOR request_key IN
                SELECT DISTINCT {REQUEST_LOCK_KEY.format("v.s", "v.r", "v.f")}
                FROM unnest(scopes, routes, fingerprints, guards) AS v(s, r, f, g)
                WHERE v.g IS NOT NULL ORDER BY 1
            LOOP
                PERFORM pg_advisory_xact_lock({REQUEST_LOCK_CLASS}, request_key);
            END LOOP;
            RETURN QUERY
            WITH input AS (
                SELECT * FROM unnest(ids, scopes, keys, routes, methods, paths, fingerprints,
                    owners, leases, kept, actors, datas, payloads, storages, guards, windows,
                    vouched, kinds, legacies) WITH ORDINALITY
                AS v(id, scope, key, route, method, path, fingerprint, lease_owner,
                    lease_seconds, request_kept, actor, data, payload, storage, guard,
                    window_seconds, vouched, request_kind, legacy, ord)
            ),
            clock AS (
                SELECT clock_timestamp() AS now,
                    (extract(epoch from clock_timestamp()) * 1000000)::bigint AS at_us
            ),
            -- New keys under a guard; a request met earlier in the batch waits for the
            -- claim of that one to commit (decided alone afterwards, `nth > 1`).
            guarded AS (
                SELECT i.*, clock.now AS now, row_number() OVER (
                    PARTITION BY i.scope, i.route, i.fingerprint ORDER BY i.ord) AS nth
                FROM input i CROSS JOIN clock
                -- One probe of the unique (scope, key) per claim: as an anti join, planned
                -- generic while the table was small, it became a scan of every row.
                LEFT JOIN LATERAL (
                    SELECT true AS present FROM operations o
                    WHERE o.scope = i.scope AND o.key = i.key OFFSET 0
                ) AS known ON true
                WHERE i.guard IS NOT NULL AND known.present IS NULL
            ),
            deferred AS (SELECT id FROM guarded WHERE nth > 1),
            checked AS (
                SELECT g.*, CASE WHEN g.vouched
                    THEN g.now - make_interval(secs => g.window_seconds)
                    ELSE '-infinity'::timestamptz END AS since
                FROM guarded g WHERE g.nth = 1 AND g.guard IN ('unsettled', 'all')
            ),
            bound AS (
                SELECT c.id AS for_id, b.twin_id
                FROM checked c
                JOIN similar_refusals b ON b.scope = c.scope AND b.key = c.key
                    AND b.fingerprint IN (c.fingerprint, c.legacy) AND b.refused_at > c.since
                JOIN operations t ON t.id = b.twin_id
                    AND (t.forgotten_at IS NULL OR t.forgotten_at > c.now)
            ),
            twins AS (
                SELECT c.id AS for_id, t.id AS twin_id, t.state AS twin_state
                FROM checked c, LATERAL (
                    (SELECT o.id, o.state, 0 AS rank FROM operations o
                     WHERE o.scope = c.scope AND o.route = c.route
                        AND o.fingerprint IN (c.fingerprint, c.legacy)
                        AND o.state IN ('in_flight', 'unknown') AND o.sent_at > c.since
                     ORDER BY o.sent_at DESC LIMIT 1)
                    UNION ALL
                    (SELECT o.id, o.state, 1 FROM operations o
                     WHERE o.scope = c.scope AND o.route = c.route
                        AND o.fingerprint IN (c.fingerprint, c.legacy) AND o.state = 'completed'
                        AND o.sent_at > c.since
                        AND (o.forgotten_at IS NULL OR o.forgotten_at > c.now)
                     ORDER BY o.sent_at DESC LIMIT 1)
                    ORDER BY rank LIMIT 1
                ) AS t
            ),
            refused AS (
                SELECT c.id AS for_id, coalesce(b.twin_id, t.twin_id) AS twin_id,
                    b.twin_id IS NULL AS fresh, c.scope, c.key, c.fingerprint, c.now,
                    c.window_seconds
                FROM checked c
                LEFT JOIN bound b ON b.for_id = c.id
                LEFT JOIN twins t ON t.for_id = c.id
                WHERE b.twin_id IS NOT NULL OR t.twin_state IN ('in_flight', 'unknown')
                    OR (c.guard = 'all' AND t.twin_state = 'completed')
            ),
            binding AS (
                INSERT INTO similar_refusals AS s
                    (scope, key, fingerprint, twin_id, refused_at, expires_at)
                SELECT DISTINCT ON (r.scope, r.key) r.scope, r.key, r.fingerprint, r.twin_id,
                    r.now, r.now + make_interval(secs => r.window_seconds)
                FROM refused r WHERE r.fresh
                ON CONFLICT (scope, key) DO UPDATE SET fingerprint = excluded.fingerprint,
                    twin_id = excluded.twin_id, refused_at = excluded.refused_at,
                    expires_at = excluded.expires_at
            ),
            inserted AS (
                INSERT INTO operations (id, scope, key, state, route, method, path,
                    fingerprint, attempts, token, version, created_at, updated_at,
                    lease_owner, lease_expires_at, sent_at, request_kept, history_seq,
                    history_head, request_kind)
                SELECT i.id, i.scope, i.key, 'in_flight', i.route, i.method, i.path,
                    i.fingerprint, 1, 1, 1, clock.now, clock.now, i.lease_owner,
                    clock.now + make_interval(secs => i.lease_seconds), clock.now,
                    i.request_kept, 1,
                    gateway_event_hash(i.actor, clock.at_us, i.data, '', 1, 'claimed', 1,
                        inner_pad, outer_pad), i.request_kind
                FROM input i CROSS JOIN clock
                WHERE i.id NOT IN (SELECT id FROM deferred)
                    AND i.id NOT IN (SELECT r.for_id FROM refused r)
                ON CONFLICT (scope, key) DO NOTHING
                RETURNING operations
            ),
            events AS (
                INSERT INTO operation_events (operation_id, seq, type, at_us, actor, version,
                    data, payload, storage, prev, hash)
                SELECT (n.operations).id, 1, 'claimed', clock.at_us, v.actor, 1, v.data,
                    v.payload, v.storage, '', (n.operations).history_head
                FROM inserted n JOIN input v ON v.id = (n.operations).id CROSS JOIN clock
            )
            SELECT n.operations, 'inserted', NULL::text FROM inserted n
            UNION ALL
            SELECT o, 'similar', r.for_id FROM refused r JOIN operations o ON o.id = r.twin_id
            UNION ALL
            SELECT o, 'twin', t.for_id FROM twins t JOIN operations o ON o.id = t.twin_id
            WHERE t.twin_state = 'completed' AND t.for_id NOT IN (SELECT r.for_id FROM refused r)
            UNION ALL
            SELECT found.o, 'existing', i.id FROM input i, LATERAL (
                SELECT o FROM operations o WHERE o.scope = i.scope AND o.key = i.key OFFSET 0
            ) AS found;
        END
        $$
        """,
    ),
    # History that cannot be quietly cut (gateway.engine.history): with a history key,
    # which operations had plain events when the key came (from which `seq` theirs must
    # be keyed), and the heads a checkpoint saw, signed, outside the operations' rows.
    9: (
        """
        CREATE TABLE history_keyed_since (
            operation_id text PRIMARY KEY,
            seq integer NOT NULL,
            mac text NOT NULL
        )
        """,
        """
        CREATE TABLE history_checkpoints (
            operation_id text PRIMARY KEY,
            seq integer NOT NULL,
            head text NOT NULL,
            checkpoint bigint NOT NULL,
            at_us bigint NOT NULL,
            mac text NOT NULL
        )
        """,
        """
        CREATE TABLE history_checkpoint_log (
            checkpoint bigint PRIMARY KEY,
            at_us bigint NOT NULL,
            count integer NOT NULL,
            prev text NOT NULL,
            mac text NOT NULL
        )
        """,
    ),
    # Secrets stay secret: stored fingerprints are keyed per scope (`_key_fingerprints`).
    10: (),
    # The key's request log (gateway.engine.request_lines): kept lines, and counts of all.
    11: (
        """
        CREATE TABLE request_log (
            operation_id text NOT NULL,
            seq bigint NOT NULL,
            at timestamptz NOT NULL,
            request_id text NOT NULL,
            status integer NOT NULL,
            outcome text NOT NULL,
            replayed boolean NOT NULL,
            problem text,
            PRIMARY KEY (operation_id, seq)
        )
        """,
        """
        CREATE TABLE request_counts (
            operation_id text PRIMARY KEY,
            total bigint NOT NULL,
            replays bigint NOT NULL,
            refusals bigint NOT NULL
        )
        """,
    ),
}


async def _key_fingerprints(connection: asyncpg.pool.PoolConnectionProxy[asyncpg.Record]) -> None:
    """Version 10: every plain fingerprint kept becomes its keyed form, read by a cursor
    and written back in batches (`gateway.store.fingerprint_migration`)."""
    from gateway.engine.digests import keyed_fingerprint
    from gateway.store.fingerprint_migration import BATCH, PLAIN_FINGERPRINT, SECRET_QUERY

    secret = await connection.fetchval(SECRET_QUERY)
    if secret is None:
        return  # no secret, so no operation yet (or a lost secret, refused at open)
    # Rows are found by their unique columns: the id, or the binding's (scope, key).
    for table, unique in (("operations", ("id",)), ("similar_refusals", ("scope", "key"))):
        columns = ", ".join(unique)
        arrays = ", ".join(f"${n}::text[]" for n in range(1, len(unique) + 2))
        match = " AND ".join(f"o.{name} = v.{name}" for name in unique)
        update = (
            f"UPDATE {table} AS o SET fingerprint = v.keyed "
            f"FROM unnest({arrays}) AS v({columns}, keyed) WHERE {match}"
        )
        batch: list[list[str]] = [[] for _ in range(len(unique) + 1)]
        select = f"SELECT {columns}, scope, fingerprint FROM {table} WHERE {PLAIN_FINGERPRINT}"
        async for record in connection.cursor(select):
            for column, value in zip(batch[:-1], record[: len(unique)], strict=True):
                column.append(value)
            plain = record["fingerprint"]
            batch[-1].append(keyed_fingerprint(bytes(secret), record["scope"], plain))
            if len(batch[-1]) >= BATCH:
                await connection.execute(update, *batch)
                batch = [[] for _ in range(len(unique) + 1)]
        if batch[-1]:
            await connection.execute(update, *batch)


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


_PYTHON_STEPS = {5: _reconstruct_histories, 10: _key_fingerprints}


async def migrate(connection: asyncpg.pool.PoolConnectionProxy[asyncpg.Record]) -> int:
    """Bring the schema to `SCHEMA_VERSION`; safe when several replicas start at once."""
    if await migrate_unpartitioned(connection) < SCHEMA_VERSION:
        from gateway.store import postgres_migration12

        await postgres_migration12.migrate(connection)
    return SCHEMA_VERSION


async def migrate_unpartitioned(
    connection: asyncpg.pool.PoolConnectionProxy[asyncpg.Record],
) -> int:
    """Versions 1 to `_IN_ONE_TRANSACTION`, under the migration lock; the version after.

    The schema before partitioning: tests build a store of the previous version with it.
    """
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
        for version in range((current or 0) + 1, _IN_ONE_TRANSACTION + 1):
            for statement in _MIGRATIONS[version]:
                await connection.execute(statement)
            step = _PYTHON_STEPS.get(version)
            if step is not None:
                await step(connection)
        if current is None:
            await connection.execute(
                "INSERT INTO gateway_schema_version (version) VALUES ($1)", _IN_ONE_TRANSACTION
            )
        elif current < _IN_ONE_TRANSACTION:
            await connection.execute(
                "UPDATE gateway_schema_version SET version = $1", _IN_ONE_TRANSACTION
            )
    return max(current or 0, _IN_ONE_TRANSACTION)
