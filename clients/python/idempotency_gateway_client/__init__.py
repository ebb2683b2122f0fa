"""Agent-side client for the idempotency gateway."""

from __future__ import annotations

__all__: list[str] = []
