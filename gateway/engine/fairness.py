"""A route's upstream slots, and each scope's share of them: no tenant starves another.

A route has `max_concurrency` slots in each of two lanes:

- **calls**: every upstream exchange a caller starts (a protected call, a
  request passed through, an MCP message passed through), held from before
  the claim to the last byte of its answer, however long the caller takes to
  read it;
- **streams**: MCP server streams (a `GET` on an MCP route), which live as
  long as a session, so they never take a call's slot.

While two or more scopes use a route, no scope may hold more than its
share of a lane, `fair_share(max_concurrency)` (half, rounded up): past it
the scope is refused `quota-exceeded` (429) and the others keep the rest. A
full lane refuses everyone else `route-saturated` (503).

Who uses a route:

- on a route that two or more `[[clients]]` may use (`tenants`), they all
  do, always: the share holds from the first request, so a client that came
  first cannot take the slots another will need (a held slot cannot be taken
  back: a call in progress is never cut to make room);
- elsewhere (scopes made from credentials, which anyone can mint), a scope
  uses the route while it holds a slot there and for `USE_WINDOW_SECONDS`
  after its last request, refused ones included. A scope alone may use every
  slot; a newcomer refused because it filled the route turns the share on,
  and gets the slots given back as that scope's calls end.

Counted per process: with `[server] workers = N`, each worker has its own
slots and the share is half of that worker's.
"""

from __future__ import annotations

import enum
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TypeVar

from gateway.engine.errors import QuotaExceeded, RouteSaturated

USE_WINDOW_SECONDS = 30.0
"""How long after its last request a scope still counts as using a route."""

MAX_TRACKED_SCOPES = 10_000
"""Scopes whose last request each route remembers; the least recently seen go first."""

_K = TypeVar("_K")


class Lane(enum.Enum):
    CALLS = "calls"
    STREAMS = "streams"


def fair_share(limit: int) -> int:
    """The slots one scope may hold while others use the route.

    >>> fair_share(8), fair_share(7), fair_share(1)
    (4, 4, 1)
    """
    return max(1, math.ceil(limit / 2))


class Hold:
    """One counted place (a route slot, a request of a scope), given back exactly once:
    when the `with` block that took it ends and every stream it was handed to
    (`keep`) has closed. An answer streamed after its handler returned still
    holds its connection, so it still holds its slot.

    >>> released = []
    >>> with Hold(lambda: released.append(True)) as hold:
    ...     close_stream = hold.keep()
    >>> released
    []
    >>> close_stream()
    >>> released
    [True]
    """

    __slots__ = ("_holders", "_release")

    def __init__(self, release: Callable[[], None]) -> None:
        self._release: Callable[[], None] | None = release
        self._holders = 1

    def __enter__(self) -> Hold:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._drop()

    def keep(self) -> Callable[[], None]:
        """One more holder (a stream that outlives the block); call what it returns, once,
        when the stream is done with."""
        self._holders += 1
        dropped = False

        def drop() -> None:
            nonlocal dropped
            if not dropped:
                dropped = True
                self._drop()

        return drop

    def _drop(self) -> None:
        self._holders -= 1
        if self._holders == 0 and self._release is not None:
            release, self._release = self._release, None
            release()


class Unlimited(Hold):
    """The hold of a limit that is off: nothing is counted, nothing given back."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(_nothing)

    def __exit__(self, *exc_info: object) -> None:
        pass

    def keep(self) -> Callable[[], None]:
        return _nothing


def _nothing() -> None:
    pass


UNLIMITED = Unlimited()


class RouteSlots:
    """One route's slots in both lanes, and who holds them.

    >>> slots = RouteSlots("tickets", 2)
    >>> with slots.hold("alice"), slots.hold("alice"):
    ...     slots.active(Lane.CALLS)
    2
    """

    def __init__(
        self,
        route: str,
        limit: int,
        *,
        tenants: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.route = route
        self.limit = limit
        self.share = fair_share(limit)
        self.tenants = tenants
        """Two or more `[[clients]]` may use the route: the share always holds."""
        self._clock = clock
        self._active = dict.fromkeys(Lane, 0)
        self._held: dict[tuple[str, Lane], int] = {}
        self._holders: dict[str, int] = {}
        """Slots per scope, both lanes together: a scope holding any is using the route."""
        self._seen: OrderedDict[str, float] = OrderedDict()

    def active(self, lane: Lane) -> int:
        return self._active[lane]

    def hold(self, scope: str, lane: Lane = Lane.CALLS) -> Hold:
        """Take a slot for `scope`, or raise `QuotaExceeded` (past its share while others
        use the route) or `RouteSaturated` (the lane is full)."""
        now = self._clock()
        self._saw(scope, now)
        held = self._held.get((scope, lane), 0)
        if held >= self.share and self._shared(scope, now):
            raise QuotaExceeded(_over_share(self, lane, held), retry_after=1)
        if self._active[lane] >= self.limit:
            raise RouteSaturated(_saturated(self, lane), retry_after=1)
        self._active[lane] += 1
        self._held[scope, lane] = held + 1
        self._holders[scope] = self._holders.get(scope, 0) + 1
        return Hold(lambda: self._give_back(scope, lane))

    def _give_back(self, scope: str, lane: Lane) -> None:
        self._active[lane] -= 1
        decrement(self._held, (scope, lane))
        decrement(self._holders, scope)

    def _saw(self, scope: str, now: float) -> None:
        seen = self._seen
        if scope in seen:
            seen.move_to_end(scope)
        elif len(seen) >= MAX_TRACKED_SCOPES:
            seen.popitem(last=False)
        seen[scope] = now

    def _shared(self, scope: str, now: float) -> bool:
        """Whether another scope uses the route: may (tenants), holds a slot, or asked
        recently."""
        if self.tenants or len(self._holders) > (scope in self._holders):
            return True
        # `_saw` put `scope` last: the entry before it is the most recent other scope.
        for other in reversed(self._seen):
            if other != scope:
                return now - self._seen[other] < USE_WINDOW_SECONDS
        return False


def decrement(table: dict[_K, int], key: _K) -> None:
    """One less of `key`; a count that reaches 0 leaves the table (it stays bounded)."""
    remaining = table[key] - 1
    if remaining:
        table[key] = remaining
    else:
        del table[key]


def _over_share(slots: RouteSlots, lane: Lane, held: int) -> str:
    what = "server streams open" if lane is Lane.STREAMS else "upstream calls in progress"
    return (
        f"this client has {held} {what} on route {slots.route!r}: its share of the "
        f"route's {slots.limit} while other clients use it"
    )


def _saturated(slots: RouteSlots, lane: Lane) -> str:
    if lane is Lane.STREAMS:
        return f"route {slots.route!r} has {slots.limit} server streams open"
    return f"route {slots.route!r} has {slots.limit} upstream calls in progress"
