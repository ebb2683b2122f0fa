"""Keying the fingerprints a store kept in plain form (schema 9 on SQLite, 10 on PostgreSQL).

Plain fingerprints in the database file confirm guessed request content to
whoever reads the file, encrypted receipts or not. A keyed fingerprint is the
HMAC of the plain one (`gateway.engine.digests`), so the upgrade rewrites
every stored plain fingerprint (operations and refusal bindings) in place,
without needing the requests, and nothing plain is left behind. Claims
compare plain forms still, for what a replica of the previous version writes
during a rolling upgrade (`ClaimRequest.plain_fingerprints`).

Derived MCP keys are not rewritten: the upstream saw them (the forwarded
key), so an operation keeps the key it was sent under, and its retry finds it
by the plain key for a while (`gateway.mcp.derived_keys`).
"""

from __future__ import annotations

__all__ = ["BATCH", "PLAIN_FINGERPRINT", "SECRET_QUERY"]

PLAIN_FINGERPRINT = "(fingerprint LIKE 'sha256:%' OR fingerprint LIKE 'v2:sha256:%')"
"""Rows whose fingerprint is plain: version 1 (HTTP and MCP) or version 2 (HTTP)."""

SECRET_QUERY = "SELECT value FROM gateway_meta WHERE name = 'scope_secret'"

BATCH = 5000
"""Rows rewritten per statement on PostgreSQL: one round trip, a bounded memory."""
