"""The SQLite schema and its migrations, versioned like the PostgreSQL one.

A rowid table with a unique (scope, key) index: a `WITHOUT ROWID` table keyed
by random keys measured 1.3-2x slower on the bench machine. `seq` orders admin
listings and makes cursors cheap.
"""

from __future__ import annotations

import sqlite3

from gateway.store.rows import COLUMN_NAMES

SCHEMA_VERSION = 10

SETTLED_FUNCTION = "gateway_settled"
"""An SQL function the writer connection registers: `gateway_settled(id)` notes that a
watched operation's outcome is being written, to be signalled to other workers
once the batch holding the write has committed."""

CLOCK_FUNCTION = "gateway_now"
"""An SQL function every connection of the store registers: the store's clock (the
gateway host's), so reads report when they saw a row (`Operation.observed_at`)."""

STORED_COLUMNS = tuple(name for name in COLUMN_NAMES if name != "observed_at")
"""The table's own columns among them, for writers that insert whole rows."""

COLUMNS = tuple(
    f"{CLOCK_FUNCTION}() AS observed_at" if name == "observed_at" else name for name in COLUMN_NAMES
)

_MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        """
        CREATE TABLE gateway_meta (
            name TEXT PRIMARY KEY,
            value BLOB NOT NULL
        )
        """,
        """
        CREATE TABLE operations (
            seq INTEGER PRIMARY KEY,
            id TEXT NOT NULL UNIQUE,
            scope TEXT NOT NULL,
            key TEXT NOT NULL,
            state TEXT NOT NULL
                CHECK (state IN ('in_flight', 'completed', 'unknown', 'released')),
            route TEXT NOT NULL,
            method TEXT NOT NULL,
            path TEXT NOT NULL,
            fingerprint TEXT NOT NULL,
            attempts INTEGER NOT NULL,
            token INTEGER NOT NULL,
            version INTEGER NOT NULL,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            lease_owner TEXT,
            lease_expires_at REAL,
            sent_at REAL,
            response_status INTEGER,
            response_headers TEXT,
            response_body BLOB,
            body_retained INTEGER NOT NULL DEFAULT 1,
            expires_at REAL,
            forgotten_at REAL,
            resolution_by TEXT,
            resolution_at REAL,
            resolution_note TEXT,
            evidence TEXT NOT NULL DEFAULT '[]',
            UNIQUE (scope, key)
        )
        """,
        "CREATE INDEX operations_by_state ON operations (state, seq)",
        "CREATE INDEX operations_by_forgotten_at ON operations (forgotten_at) "
        "WHERE forgotten_at IS NOT NULL",
    ),
    # The sweep finds expired receipt bodies without scanning every completed row.
    2: (
        "CREATE INDEX operations_by_body_expiry ON operations (expires_at) "
        "WHERE response_body IS NOT NULL",
    ),
    # How each receipt is kept, said by the row (gateway.store.rows.seal_receipt). Rows
    # from before carry no marker: those whose body starts with the envelope's magic
    # were sealed by the old code, the one time bytes decide.
    3: (
        "ALTER TABLE operations ADD COLUMN storage TEXT NOT NULL DEFAULT 'plain'",
        "UPDATE operations SET storage = 'sealed' WHERE substr(response_body, 1, 4) = X'49474531'",
    ),
    # Worker processes on one file: a worker waiting on a key another holds
    # (`Prefer: wait`) marks the row, and outcome writes of marked rows wake it
    # (`SETTLED_FUNCTION`). Unmarked rows cost nothing.
    4: ("ALTER TABLE operations ADD COLUMN watched INTEGER NOT NULL DEFAULT 0",),
    # The history (gateway.engine.history): events in their own table, the chain's
    # head in the row; `request_kept` marks rows whose recorded request the sweep
    # must drop at `expires_at`. Existing rows get a reconstructed history (below).
    5: (
        "ALTER TABLE operations ADD COLUMN history_seq INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE operations ADD COLUMN history_head TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE operations ADD COLUMN request_kept INTEGER NOT NULL DEFAULT 0",
        """
        CREATE TABLE operation_events (
            operation_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            type TEXT NOT NULL,
            at_us INTEGER NOT NULL,
            actor TEXT NOT NULL,
            version INTEGER NOT NULL,
            data TEXT NOT NULL,
            payload BLOB,
            storage TEXT NOT NULL DEFAULT 'plain',
            prev TEXT NOT NULL,
            hash TEXT NOT NULL,
            PRIMARY KEY (operation_id, seq)
        ) WITHOUT ROWID
        """,
        "CREATE INDEX operations_by_request_expiry ON operations (expires_at) "
        "WHERE request_kept = 1",
    ),
    # The same request under a new key: twins are found by request (the state and
    # the attempt's start order a seek to the latest twin of each kind), and a
    # refused key's binding to its twin is kept beside the operations.
    6: (
        "CREATE INDEX operations_by_request ON operations "
        "(fingerprint, scope, route, state, sent_at)",
        """
        CREATE TABLE similar_refusals (
            scope TEXT NOT NULL,
            key TEXT NOT NULL,
            fingerprint TEXT NOT NULL,
            twin_id TEXT NOT NULL,
            refused_at REAL NOT NULL,
            expires_at REAL NOT NULL,
            PRIMARY KEY (scope, key)
        ) WITHOUT ROWID
        """,
        "CREATE INDEX similar_refusals_by_expiry ON similar_refusals (expires_at)",
    ),
    # A probe proves it can see (gateway.engine.calibration): each operation's request
    # kind, so that calibration finds a recent completed one of a kind; and the
    # calibration rows themselves. Fingerprints become version 2 (JSON compared as JSON):
    # when operations of the old form exist, the upgrade's time is kept, so that twins
    # of the old form are looked up by both forms while they may still refuse.
    7: (
        "ALTER TABLE operations ADD COLUMN request_kind TEXT",
        "CREATE INDEX operations_by_kind ON operations (route, request_kind, scope, created_at) "
        "WHERE request_kind IS NOT NULL",
        """
        CREATE TABLE probe_calibrations (
            route TEXT NOT NULL,
            kind TEXT NOT NULL,
            state TEXT NOT NULL CHECK (state IN ('calibrated', 'blind', 'trusted')),
            at REAL NOT NULL,
            sample TEXT,
            detail TEXT NOT NULL,
            until REAL,
            actor TEXT,
            note TEXT,
            events TEXT NOT NULL DEFAULT '[]',
            PRIMARY KEY (route, kind)
        ) WITHOUT ROWID
        """,
        # The host's clock, the store's on SQLite (julianday: any SQLite version).
        "INSERT INTO gateway_meta (name, value) SELECT 'fingerprint_v2_since', "
        "CAST(CAST((julianday('now') - 2440587.5) * 86400.0 AS TEXT) AS BLOB) "
        "WHERE EXISTS (SELECT 1 "
        "FROM operations WHERE method != 'tools/call' AND fingerprint LIKE 'sha256:%')",
    ),
    # History that cannot be quietly cut (gateway.engine.history): with a history key,
    # which operations had plain events when the key came (from which `seq` theirs must
    # be keyed), and the heads a checkpoint saw, signed, outside the operations' rows.
    8: (
        """
        CREATE TABLE history_keyed_since (
            operation_id TEXT PRIMARY KEY,
            seq INTEGER NOT NULL,
            mac TEXT NOT NULL
        ) WITHOUT ROWID
        """,
        """
        CREATE TABLE history_checkpoints (
            operation_id TEXT PRIMARY KEY,
            seq INTEGER NOT NULL,
            head TEXT NOT NULL,
            checkpoint INTEGER NOT NULL,
            at_us INTEGER NOT NULL,
            mac TEXT NOT NULL
        ) WITHOUT ROWID
        """,
        """
        CREATE TABLE history_checkpoint_log (
            checkpoint INTEGER PRIMARY KEY,
            at_us INTEGER NOT NULL,
            count INTEGER NOT NULL,
            prev TEXT NOT NULL,
            mac TEXT NOT NULL
        )
        """,
    ),
    # Secrets stay secret: stored fingerprints are keyed per scope (`_key_fingerprints`).
    9: (),
    # The key's request log (gateway.engine.request_lines): kept lines, and counts of all.
    10: (
        """
        CREATE TABLE request_log (
            operation_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            at REAL NOT NULL,
            request_id TEXT NOT NULL,
            status INTEGER NOT NULL,
            outcome TEXT NOT NULL,
            replayed INTEGER NOT NULL,
            problem TEXT,
            PRIMARY KEY (operation_id, seq)
        ) WITHOUT ROWID
        """,
        """
        CREATE TABLE request_counts (
            operation_id TEXT PRIMARY KEY,
            total INTEGER NOT NULL,
            replays INTEGER NOT NULL,
            refusals INTEGER NOT NULL
        ) WITHOUT ROWID
        """,
    ),
}


def _key_fingerprints(connection: sqlite3.Connection) -> None:
    """Version 9: every plain fingerprint kept becomes its keyed form, in one statement
    a table (`gateway.store.fingerprint_migration`)."""
    from gateway.engine.digests import keyed_fingerprint
    from gateway.store.fingerprint_migration import PLAIN_FINGERPRINT, SECRET_QUERY

    row = connection.execute(SECRET_QUERY).fetchone()
    if row is None:
        return  # no secret, so no operation yet (or a lost secret, refused at open)
    secret = bytes(row[0])
    connection.create_function(
        "gateway_keyed_fingerprint",
        2,
        lambda scope, plain: keyed_fingerprint(secret, scope, plain),
        deterministic=True,
    )
    for table in ("operations", "similar_refusals"):
        connection.execute(
            f"UPDATE {table} SET fingerprint = gateway_keyed_fingerprint(scope, fingerprint) "
            f"WHERE {PLAIN_FINGERPRINT}"
        )


def _reconstruct_histories(connection: sqlite3.Connection) -> None:
    """Version 5: every operation recorded before gets the history its row proves."""
    from gateway.store.history_migration import reconstructed_rows
    from gateway.store.history_rows import EVENT_COLUMNS
    from gateway.store.rows import row_to_operation

    selected = ", ".join("updated_at" if name == "observed_at" else name for name in COLUMN_NAMES)
    rows = connection.execute(f"SELECT {selected} FROM operations").fetchall()
    for row in rows:
        operation = row_to_operation(row, lenient=True)
        events, head, seq = reconstructed_rows(operation)
        connection.executemany(
            f"INSERT INTO operation_events ({EVENT_COLUMNS}) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'plain', ?, ?)",
            [tuple(event) for event in events],
        )
        connection.execute(
            "UPDATE operations SET history_head = ?, history_seq = ? WHERE id = ?",
            (head, seq, operation.id),
        )


_PYTHON_STEPS = {5: _reconstruct_histories, 9: _key_fingerprints}


def migrate(connection: sqlite3.Connection) -> int:
    """Bring the schema to `SCHEMA_VERSION` inside the caller's transaction."""
    connection.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
    row = connection.execute("SELECT version FROM schema_version").fetchone()
    current = 0 if row is None else int(row[0])
    if current > SCHEMA_VERSION:
        raise RuntimeError(
            f"the database schema is version {current}, newer than this gateway "
            f"({SCHEMA_VERSION}): upgrade the gateway"
        )
    for version in range(current + 1, SCHEMA_VERSION + 1):
        for statement in _MIGRATIONS[version]:
            connection.execute(statement)
        step = _PYTHON_STEPS.get(version)
        if step is not None:
            step(connection)
    if row is None:
        connection.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
    else:
        connection.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION,))
    return SCHEMA_VERSION
