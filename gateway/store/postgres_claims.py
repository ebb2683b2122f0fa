"""`gateway_keyed_claims`: a batch of claims in one round trip, through the key table.

Made by migration 12 in place of version 8's `gateway_claims` (dropped then, so
that a replica of the previous version, which calls it, cannot claim on a
partitioned store: its claims fail, nothing is forwarded). It does what that
function did (each guarded request's advisory lock first, then one statement
whose snapshot follows the locks: refusals by twins, bindings, new rows, their
`claimed` events), with the key table as the arbiter of uniqueness:

- each claim's key is looked up in `operation_keys`, and, until the backfill of
  migration 12 is done (`gateway_legacy_until()` not NULL), in the partition
  from before partitioning by its old unique (scope, key) index: a key found
  either way is never claimed again;
- new keys are inserted into `operation_keys` first (`ON CONFLICT DO NOTHING`:
  a concurrent claim of the same key waits for the other transaction, then
  loses to it if it committed), and operation rows are made only for the keys
  this statement won, with the key row's `created_at`, so both name the same
  partition. The same transaction commits both or neither.

The `existing` rows are read through the key row's (id, created_at): a
nested loop whose inner scan PostgreSQL prunes per key to one partition.
"""

from __future__ import annotations

from gateway.store.postgres_schema import REQUEST_LOCK_CLASS, REQUEST_LOCK_KEY

PREVIOUS = (
    "DROP FUNCTION IF EXISTS gateway_claims(text[], text[], text[], text[], text[], text[], "
    "text[], text[], float8[], bool[], text[], text[], bytea[], text[], bytea, bytea, text[], "
    "float8[], bool[], text[], text[])"
)
"""Version 8's function, dropped by the migration (its callers are the previous version)."""

KEYED_CLAIMS = f"""
CREATE OR REPLACE FUNCTION gateway_keyed_claims(
    ids text[], scopes text[], keys text[], routes text[], methods text[],
    paths text[], fingerprints text[], owners text[], leases float8[], kept bool[],
    actors text[], datas text[], payloads bytea[], storages text[],
    inner_pad bytea, outer_pad bytea, guards text[], windows float8[], vouched bool[],
    kinds text[], legacies text[]
) RETURNS TABLE (op operations, kind text, for_id text)
LANGUAGE plpgsql VOLATILE
-- Its plans are cached for the session, from the statistics of the moment: made while
-- the tables were small they would scan them whole, per claim, ever after.
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    request_key integer;
    -- NULL once every operation from before partitioning has its key row.
    legacy_until timestamptz := gateway_legacy_until();
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
    -- Each claim's key as this statement sees it: its key row, else (until the backfill
    -- is done) its row in the partition from before. One index probe each (LATERAL,
    -- kept from being flattened into a join that a generic plan could make a scan).
    known AS (
        SELECT i.id AS claim_id, found.op_id, found.created_at
        FROM input i, LATERAL (
            (SELECT k.id AS op_id, k.created_at FROM operation_keys k
             WHERE k.scope = i.scope AND k.key = i.key)
            UNION ALL
            (SELECT o.id, o.created_at FROM operations o
             WHERE legacy_until IS NOT NULL AND o.created_at < legacy_until
                AND o.scope = i.scope AND o.key = i.key)
            LIMIT 1
        ) AS found
    ),
    -- New keys under a guard; a request met earlier in the batch waits for the
    -- claim of that one to commit (decided alone afterwards, `nth > 1`).
    guarded AS (
        SELECT i.*, clock.now AS now, row_number() OVER (
            PARTITION BY i.scope, i.route, i.fingerprint ORDER BY i.ord) AS nth
        FROM input i CROSS JOIN clock
        WHERE i.guard IS NOT NULL AND i.id NOT IN (SELECT claim_id FROM known)
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
    -- The keys this statement claims: a key another transaction is claiming waits for
    -- it, and is lost to it if it commits. Only the keys won get an operation row.
    won AS (
        INSERT INTO operation_keys AS k (scope, key, id, created_at)
        SELECT i.scope, i.key, i.id, clock.now FROM input i CROSS JOIN clock
        WHERE i.id NOT IN (SELECT id FROM deferred)
            AND i.id NOT IN (SELECT r.for_id FROM refused r)
            AND i.id NOT IN (SELECT claim_id FROM known)
        ON CONFLICT DO NOTHING
        RETURNING k.id
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
        FROM input i JOIN won w ON w.id = i.id CROSS JOIN clock
        RETURNING operations
    ),
    events AS (
        INSERT INTO operation_events (operation_id, seq, type, at_us, actor, version,
            data, payload, storage, prev, hash, op_created_at)
        SELECT (n.operations).id, 1, 'claimed', clock.at_us, v.actor, 1, v.data,
            v.payload, v.storage, '', (n.operations).history_head,
            gateway_event_key((n.operations).created_at)
        FROM inserted n JOIN input v ON v.id = (n.operations).id CROSS JOIN clock
    )
    SELECT n.operations, 'inserted', NULL::text FROM inserted n
    UNION ALL
    SELECT o, 'similar', r.for_id FROM refused r JOIN operations o ON o.id = r.twin_id
    UNION ALL
    SELECT o, 'twin', t.for_id FROM twins t JOIN operations o ON o.id = t.twin_id
    WHERE t.twin_state = 'completed' AND t.for_id NOT IN (SELECT r.for_id FROM refused r)
    UNION ALL
    SELECT found.o, 'existing', kn.claim_id FROM known kn, LATERAL (
        SELECT o FROM operations o
        WHERE o.id = kn.op_id AND o.created_at = kn.created_at OFFSET 0
    ) AS found;
END
$$
"""
