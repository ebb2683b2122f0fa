"""The PostgreSQL store's connections: the pool, the notification listener, driver errors.

Kept apart from the store's verbs (`gateway.store.postgres`) because it
changes for other reasons: how asyncpg is driven (a pool whose reset costs no
round trip, a dedicated connection that LISTENs and comes back by itself
after the server did) rather than what a claim or a receipt writes. Every
driver or connection failure leaves here as `StoreUnavailable`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import asyncpg

from gateway.engine.errors import STORE_DOWN, StoreUnavailable
from gateway.store.postgres_schema import NOTIFY_CHANNEL

log = logging.getLogger("gateway.store.postgres")

_DRIVER_ERRORS = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,  # raised by pooled connections while the server shuts down
    OSError,
    asyncio.TimeoutError,
)


@contextlib.asynccontextmanager
async def _translated(action: str) -> AsyncIterator[None]:
    try:
        yield
    except _DRIVER_ERRORS as exc:
        log.warning("postgres %s failed: %s", action, exc)
        raise StoreUnavailable(STORE_DOWN, internal=f"PostgreSQL {action} failed: {exc}") from exc


async def _session_unchanged(connection: asyncpg.Connection) -> None:
    """The pool's reset: nothing to undo, so no round trip on every release.

    asyncpg's default reset sends `pg_advisory_unlock_all(); CLOSE ALL;
    UNLISTEN *; RESET ALL` each time a connection goes back to the pool: one
    extra round trip per store call, as many as the calls themselves. This
    store never changes a pooled session: no SET, no LISTEN (the listener has
    its own connection), no session advisory lock (migrations take a
    transaction-scoped one), no cursor outside a transaction. asyncpg still
    rolls back a transaction left open before this runs.
    """


class PostgresConnection:
    """The pool and the listener a `PostgresStore` runs its statements through."""

    def __init__(self, url: str, *, pool_size: int, command_timeout: float) -> None:
        self._url = url
        self._pool_size = pool_size
        self._command_timeout = command_timeout
        self._pool: asyncpg.Pool | None = None
        self._listener: asyncpg.Connection | None = None
        self._on_settled: Callable[[str], None] | None = None
        self._relisten: asyncio.Task[None] | None = None

    async def _open_pool(self) -> asyncpg.Pool:
        async with _translated("connect"):
            self._pool = await asyncpg.create_pool(
                self._url,
                min_size=1,
                max_size=self._pool_size,
                command_timeout=self._command_timeout,
                reset=_session_unchanged,
            )
        return self._pool

    async def _close_connections(self) -> None:
        pool, self._pool = self._pool, None
        if self._relisten is not None:
            self._relisten.cancel()
            await asyncio.gather(self._relisten, return_exceptions=True)
        if self._listener is not None:
            with contextlib.suppress(*_DRIVER_ERRORS):
                await self._listener.close()
            self._listener = None
        if pool is not None:
            await pool.close()

    async def subscribe(self, on_settled: Callable[[str], None]) -> bool:
        """Call `on_settled(operation_id)` whenever any replica records an outcome."""
        self._on_settled = on_settled
        await self._listen()
        return True

    async def _listen(self) -> None:
        if self._on_settled is None or (
            self._listener is not None and not self._listener.is_closed()
        ):
            return
        callback = self._on_settled

        def relay(
            _connection: asyncpg.Connection[Any] | asyncpg.pool.PoolConnectionProxy[Any],
            _pid: int,
            _channel: str,
            payload: object,
        ) -> None:
            callback(str(payload))

        async with _translated("listen"):
            listener = await asyncpg.connect(self._url)
            await listener.add_listener(NOTIFY_CHANNEL, relay)
            listener.add_termination_listener(self._listener_lost)
        self._listener = listener

    def _listener_lost(self, _connection: object) -> None:
        """The server went away: keep trying to listen again, once a second."""
        if self._pool is not None and self._relisten is None:
            self._relisten = asyncio.get_running_loop().create_task(self._relisten_forever())

    async def _relisten_forever(self) -> None:
        try:
            while self._pool is not None and not self.listening:
                await asyncio.sleep(1.0)
                with contextlib.suppress(StoreUnavailable):
                    await self._listen()
        finally:
            self._relisten = None

    @property
    def listening(self) -> bool:
        """False while the notification connection is down (waiters then poll)."""
        return self._listener is not None and not self._listener.is_closed()

    def _require_pool(self) -> asyncpg.Pool:
        if self._pool is None:
            raise StoreUnavailable("the PostgreSQL store is not open")
        return self._pool

    async def _fetchrow(self, action: str, query: str, *args: Any) -> Any:
        async with _translated(action):
            return await self._require_pool().fetchrow(query, *args)

    async def _fetch(self, action: str, query: str, *args: Any) -> list[Any]:
        async with _translated(action):
            return list(await self._require_pool().fetch(query, *args))

    async def _fetchval(self, action: str, query: str, *args: Any) -> Any:
        async with _translated(action):
            return await self._require_pool().fetchval(query, *args)
