"""A client's `notifications/cancelled`: dropped for a protected call, forwarded
otherwise, and never before the call it names is known.

A cancellation proves nothing about the effect, and a server that stops the
tool would turn one protocol generation's timeout into a receipt (`-32800`)
and the other's into a lost stream: so the cancellation of a protected call
is acknowledged and logged, never forwarded, and the call runs on so that its
outcome is recorded for the retry. Any other cancellation is the server's
business and is forwarded.

With workers, a cancellation may reach a worker before the call it names has
been announced there (`gateway.mcp.known_calls`), and may even reach the
server first. So the client is answered 202 at once, and the cancellation is
decided in the background: as soon as its name is known, or once the route's
`cancel_hold` has passed (then it names nothing the gateway has seen, and is
forwarded). The last check and the start of the forward happen in one step of
the event loop, so no request of this worker can slip between them.

Held cancellations are bounded (`MAX_HELD` per worker, and `MAX_HELD_PER_SCOPE`
for each tenant, so that one tenant's flood leaves the others room): past
that a new one is dropped, which is always safe (MCP cancellations are
advisory) where forwarding it might not be. The drops are logged at most once
a second (`SHED_LOG_SECONDS`), with how many were dropped since the last line:
a flood of cancellations is not a flood of log lines. Held cancellations are
cancelled, i.e. dropped, when the worker stops.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from gateway.mcp.known_calls import Known, KnownCalls

MAX_HELD = 4096
"""Cancellations a worker decides in the background at once, at most."""

MAX_HELD_PER_SCOPE = 256
"""Of those, the most one scope (tenant) may have held at once."""

SHED_LOG_SECONDS = 1.0
"""Dropped cancellations are logged at most this often, counted."""

log = logging.getLogger("gateway.mcp")

Forward = Callable[[], Awaitable[None]]


class Cancellations:
    """The background tasks deciding this worker's cancellations.

    >>> # cancellations = Cancellations(known_calls)
    >>> # if not cancellations.dropped_at_once(name, route="tools"):
    >>> #     cancellations.decide(name, hold=1.0, forward=send_it, route="tools")
    >>> # ... and at shutdown: await cancellations.close()
    """

    def __init__(
        self,
        calls: KnownCalls,
        *,
        limit: int = MAX_HELD,
        per_scope: int = MAX_HELD_PER_SCOPE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._calls = calls
        self._limit = limit
        self._per_scope = per_scope
        self._clock = clock
        self._tasks: set[asyncio.Task[None]] = set()
        self._held: dict[str, int] = {}
        self._shed = 0
        self._shed_logged_at = float("-inf")

    def __len__(self) -> int:
        return len(self._tasks)

    def dropped_at_once(self, name: str, *, route: str) -> bool:
        """Drop the cancellation now if it names a known protected call (no task needed)."""
        if self._calls.known(name) is not Known.PROTECTED:
            return False
        self._calls.held_back(name)
        return True

    def decide(
        self, name: str, *, hold: float, forward: Forward, route: str, scope: str = ""
    ) -> None:
        """Drop or forward the cancellation of `name` (a call of `scope`) in the
        background: once the name is known, or after `hold` seconds."""
        held = self._held.get(scope, 0)
        if len(self._tasks) >= self._limit or held >= self._per_scope:
            self._shed_one(route)
            return
        task = asyncio.create_task(self._decide(name, hold, forward, route))
        self._tasks.add(task)
        self._held[scope] = held + 1
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(lambda _: self._release(scope))

    def _release(self, scope: str) -> None:
        left = self._held[scope] - 1
        if left:
            self._held[scope] = left
        else:
            del self._held[scope]

    def _shed_one(self, route: str) -> None:
        self._shed += 1
        now = self._clock()
        if now - self._shed_logged_at < SHED_LOG_SECONDS:
            return
        log.warning(
            "%d cancellations dropped: too many already wait for their call (at most %d "
            "a worker, %d a client)",
            self._shed,
            self._limit,
            self._per_scope,
            extra={"event": "mcp_cancel_shed", "route": route, "dropped": self._shed},
        )
        self._shed, self._shed_logged_at = 0, now

    async def close(self) -> None:
        """Drop every cancellation still waiting (the worker stops)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _decide(self, name: str, hold: float, forward: Forward, route: str) -> None:
        await self._calls.until_known(name, hold)
        known = self._calls.known(name)
        if known is Known.PROTECTED:
            self._calls.held_back(name)
            return
        if known is None:
            log.info(
                "cancellation of a request no worker knows forwarded after %gs",
                hold,
                extra={"event": "mcp_cancel_unmatched", "route": route},
            )
        try:
            await forward()  # no await between the check above and the send's start
        except Exception:
            log.warning(
                "forwarding a cancellation failed",
                exc_info=True,
                extra={"event": "mcp_cancel_unsent", "route": route},
            )
