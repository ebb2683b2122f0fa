"""Pick the store the configured URL names."""

from __future__ import annotations

import base64
from collections.abc import Callable

from gateway.config import StoreSettings
from gateway.engine.errors import ConfigError
from gateway.store.base import Store
from gateway.store.crypto import BodyCipher
from gateway.store.sqlite import SqliteStore
from gateway.store.sqlite_connection import SharedDatabase


def make_store(
    settings: StoreSettings,
    *,
    on_batch: Callable[[int], None] | None = None,
    shared: SharedDatabase | None = None,
) -> Store:
    """A not-yet-opened store for `store.url` (`shared`: as one worker of a gateway on
    an SQLite file; PostgreSQL workers are replicas and need nothing)."""
    keys = [key.get_secret_value() for key in settings.encryption_keys]
    cipher = BodyCipher(keys) if keys else None
    history_key = (
        None
        if settings.history_key is None
        else base64.b64decode(settings.history_key.get_secret_value())
    )
    path = settings.sqlite_path
    if path is not None:
        return SqliteStore(
            path=path,
            busy_timeout=settings.busy_timeout,
            on_batch=on_batch,
            cipher=cipher,
            shared=shared,
            history_key=history_key,
        )
    if settings.is_postgres:
        from gateway.store.postgres import PostgresStore  # asyncpg only when it is used

        return PostgresStore(
            settings.url, pool_size=settings.pool_size, cipher=cipher, history_key=history_key
        )
    raise ConfigError(f"store.url: no store implementation for {settings.url!r}")
