"""The idempotency gateway: a reverse proxy that gives every tool API an Idempotency-Key."""

from __future__ import annotations

__version__ = "0.1.0"
