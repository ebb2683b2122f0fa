"""Per-scope quotas: one agent cannot hog a route or fill the disk with tombstones.

Three limits from `[quotas]`, each off at 0:

- `max_in_flight`: protected requests of one scope being handled at once;
- `new_keys_per_minute`: keys one scope may start in a sliding minute;
- `max_operations`: records (receipts and tombstones) one scope may keep.

They are checked before the claim, so a refused request (429
`quota-exceeded`, safe to retry later) has recorded nothing. The first two
are counted in this process (each replica enforces its own share); the
record count comes from the store, cached for a few seconds per scope so the
hot path does not count rows on every request.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from gateway.errors import QuotaExceeded

if TYPE_CHECKING:
    from gateway.config import QuotaSettings

COUNT_CACHE_SECONDS = 5.0
WINDOW_SECONDS = 60.0


class ScopeQuotas:
    """Admission control per scope.

    >>> # with quotas.in_flight(scope): ...;  await quotas.admit_new_key(scope, count_fn)
    """

    def __init__(self, settings: QuotaSettings) -> None:
        self._settings = settings
        self._in_flight: dict[str, int] = {}
        self._new_keys: dict[str, deque[float]] = {}
        self._counts: dict[str, tuple[float, int]] = {}

    @property
    def limits_new_keys(self) -> bool:
        """Whether a request must first learn if its key is new (costs one read)."""
        return bool(self._settings.new_keys_per_minute or self._settings.max_operations)

    @contextmanager
    def in_flight(self, scope: str) -> Iterator[None]:
        limit = self._settings.max_in_flight
        current = self._in_flight.get(scope, 0)
        if limit and current >= limit:
            raise QuotaExceeded(
                f"this client already has {current} requests in flight (limit {limit})",
                retry_after=1,
            )
        self._in_flight[scope] = current + 1
        try:
            yield
        finally:
            remaining = self._in_flight[scope] - 1
            if remaining:
                self._in_flight[scope] = remaining
            else:
                del self._in_flight[scope]

    async def admit_new_key(self, scope: str, count: Callable[[], Awaitable[int]]) -> None:
        """Charge one new key to the scope, or raise `QuotaExceeded`."""
        now = time.monotonic()
        rate = self._settings.new_keys_per_minute
        if rate:
            window = self._new_keys.setdefault(scope, deque())
            while window and now - window[0] >= WINDOW_SECONDS:
                window.popleft()
            if len(window) >= rate:
                raise QuotaExceeded(
                    f"this client started {rate} new keys in the last minute (the limit)",
                    retry_after=max(1.0, WINDOW_SECONDS - (now - window[0])),
                )
        limit = self._settings.max_operations
        if limit:
            counted_at, stored = self._counts.get(scope, (0.0, -1))
            if stored < 0 or now - counted_at >= COUNT_CACHE_SECONDS:
                stored, counted_at = await count(), now
            if stored >= limit:
                self._counts[scope] = (counted_at, stored)
                raise QuotaExceeded(
                    f"this client keeps {stored} operations (limit {limit}); they are "
                    "forgotten after tombstone_retention"
                )
            self._counts[scope] = (counted_at, stored + 1)
        if rate:
            self._new_keys[scope].append(now)
