"""Stores persist operations; `open_store` picks one from the configured URL."""

from __future__ import annotations

from gateway.store.base import OperationFilter, Page, Store, SweepReport

__all__ = ["OperationFilter", "Page", "Store", "SweepReport"]
