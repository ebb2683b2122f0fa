"""The outbound HTTP client every front end sends through: one send, never retried.

It implements the engine's `Upstream` protocol; the engine never sees the
client library, only the gateway's own errors for "not sent" and "maybe sent".
"""
