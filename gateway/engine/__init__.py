"""The protocol-free core: the idempotency state machine and everything it decides with.

Keys, scopes, fingerprints, leases, probes' verdicts, quotas and the sweep
live here, speaking to the store (`gateway.store`) and to an upstream only
through the `Upstream` protocol (`gateway.engine.exchange`). No HTTP server
or client library is imported here, so the engine can be driven by any front
end, and by the deterministic simulation in tests/simulation, unchanged.
"""
