"""Per-scope quotas: one agent cannot hog a route or fill the disk with tombstones.

Four limits from `[quotas]`, each off at 0:

- `max_in_flight`: requests of one scope being handled at once, every kind
  (protected, passed through, MCP messages passed through);
- `max_streams`: MCP server streams one scope holds open (default 16);
- `new_keys_per_minute`: keys one scope may start in a sliding minute;
- `max_operations`: records (receipts and tombstones) one scope may keep.

A fourth, `route_new_keys_per_minute`, counts every scope of a route together:
a caller that presents a fresh credential per request gets a fresh scope each
time and escapes the per-scope limits, never this one.

They are checked before the claim, so a refused request (429
`quota-exceeded`, safe to retry later) has recorded nothing. The two
in-flight limits are gateway-wide caps divided among the workers (each of N
workers allows `ceil(limit / N)`); the rates are counted in each process
(each replica enforces its own); the record count comes from the store,
cached for a few seconds per scope so the hot path does not count rows on
every request. A scope's share of one route's slots is
`gateway.engine.fairness`'s, and applies whatever these say.

The per-scope tables are bounded (`MAX_TRACKED_SCOPES`, least recently seen
dropped first) whatever the number of credentials that arrive: a dropped
scope starts afresh, which the route-wide cap still bounds.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from gateway.engine.errors import QuotaExceeded
from gateway.engine.fairness import UNLIMITED, Hold, Lane, decrement

if TYPE_CHECKING:
    from gateway.config import QuotaSettings

COUNT_CACHE_SECONDS = 5.0
WINDOW_SECONDS = 60.0
MAX_TRACKED_SCOPES = 10_000
"""Per-scope windows and counts kept at most; memory stays flat under credential churn."""


class ScopeQuotas:
    """Admission control per scope.

    >>> # with quotas.in_flight(scope): ...;  await quotas.admit_new_key(scope, count_fn)
    """

    def __init__(self, settings: QuotaSettings, *, workers: int = 1) -> None:
        self._settings = settings
        self._limits = {
            Lane.CALLS: _per_worker(settings.max_in_flight, workers),
            Lane.STREAMS: _per_worker(settings.max_streams, workers),
        }
        self._in_flight: dict[tuple[str, Lane], int] = {}
        self._new_keys: OrderedDict[str, deque[float]] = OrderedDict()
        self._route_new_keys: dict[str, deque[float]] = {}
        self._counts: OrderedDict[str, tuple[float, int]] = OrderedDict()

    @property
    def max_bindings(self) -> int:
        """`max_bindings`: the keys one scope may have bound by `similar-operation`
        refusals (0: no limit)."""
        return self._settings.max_bindings

    @property
    def limits_new_keys(self) -> bool:
        """Whether a request must first learn if its key is new (costs one read)."""
        settings = self._settings
        return bool(
            settings.new_keys_per_minute
            or settings.max_operations
            or settings.route_new_keys_per_minute
        )

    def tracked_scopes(self) -> int:
        """How many scopes the largest per-scope table holds (for tests and metrics)."""
        return max(len(self._new_keys), len(self._counts))

    def in_flight(self, scope: str, lane: Lane = Lane.CALLS) -> Hold:
        """Count one request (or server stream) of `scope` until the hold is given back,
        or raise `QuotaExceeded` at the scope's limit."""
        limit = self._limits[lane]
        if not limit:
            return UNLIMITED
        entry = (scope, lane)
        current = self._in_flight.get(entry, 0)
        if current >= limit:
            what = "server streams open" if lane is Lane.STREAMS else "requests in flight"
            raise QuotaExceeded(
                f"this client already has {current} {what} (limit {limit})", retry_after=1
            )
        self._in_flight[entry] = current + 1
        return Hold(lambda: decrement(self._in_flight, entry))

    async def admit_new_key(
        self, scope: str, route: str, count: Callable[[], Awaitable[int]]
    ) -> None:
        """Charge one new key to the scope and the route, or raise `QuotaExceeded`."""
        now = time.monotonic()
        route_rate = self._settings.route_new_keys_per_minute
        route_window = self._route_new_keys.setdefault(route, deque()) if route_rate else None
        if route_window is not None:
            _check_rate(
                route_window, route_rate, now, f"route {route!r} started {route_rate} new keys"
            )
        rate = self._settings.new_keys_per_minute
        window = _touch(self._new_keys, scope, deque) if rate else None
        if window is not None:
            _check_rate(window, rate, now, f"this client started {rate} new keys")
        limit = self._settings.max_operations
        if limit:
            counted_at, stored = _touch(self._counts, scope, lambda: (0.0, -1))
            if stored < 0 or now - counted_at >= COUNT_CACHE_SECONDS:
                stored, counted_at = await count(), now
            if stored >= limit:
                self._counts[scope] = (counted_at, stored)
                raise QuotaExceeded(
                    f"this client keeps {stored} operations (limit {limit}); they are "
                    "forgotten after tombstone_retention"
                )
            self._counts[scope] = (counted_at, stored + 1)
        if window is not None:
            window.append(now)
        if route_window is not None:
            route_window.append(now)


def _per_worker(limit: int, workers: int) -> int:
    """A gateway-wide cap as one worker's part of it (0 stays "no limit").

    >>> _per_worker(16, 4), _per_worker(2, 4), _per_worker(0, 4)
    (4, 1, 0)
    """
    return math.ceil(limit / workers) if limit else 0


def _check_rate(window: deque[float], rate: int, now: float, what: str) -> None:
    while window and now - window[0] >= WINDOW_SECONDS:
        window.popleft()
    if len(window) >= rate:
        raise QuotaExceeded(
            f"{what} in the last minute (the limit)",
            retry_after=max(1.0, WINDOW_SECONDS - (now - window[0])),
        )


_V = TypeVar("_V")


def _touch(table: OrderedDict[str, _V], scope: str, make: Callable[[], _V]) -> _V:
    """The scope's entry, made if missing and marked most recently seen; the least
    recently seen scopes are dropped beyond `MAX_TRACKED_SCOPES`."""
    entry = table.get(scope)
    if entry is None:
        entry = table[scope] = make()
        while len(table) > MAX_TRACKED_SCOPES:
            table.popitem(last=False)
    else:
        table.move_to_end(scope)
    return entry
