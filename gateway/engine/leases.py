"""The leases this process holds, their renewal, and the writes it still owes the store.

A lease says "this process is working on this key; leave it alone until
then". While a slow upstream call runs, the keeper renews it every third of
its length in one batched store call. When the store was down at the wrong
moment, the keeper remembers what it owes and pays it once the store is back:

- a claim whose commit failed: the request was never sent, so if the claim
  did land after all, it is released (never left to expire into `unknown`).
  Only that claim: a later claim of the same key by this process that was
  granted supersedes the debt (the failed one cannot have landed, or that
  later claim would have met it), and an attempt that is held or owes an
  outcome was sent and is never released as unsent;
- an outcome that could not be recorded (a receipt, a release, an unknown
  mark): the write is retried with the attempt's token, so a stale retry can
  still never overwrite a newer truth.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, NamedTuple

from gateway.engine.clock import SYSTEM_CLOCK, Clock
from gateway.engine.errors import StoreUnavailable
from gateway.engine.models import Evidence, State

if TYPE_CHECKING:
    from gateway.engine.graces import GraceClock
    from gateway.store.base import Store

log = logging.getLogger("gateway.leases")

OwedWrite = Callable[[], Awaitable[object]]


class _Hold(NamedTuple):
    """A lease this process holds: its attempt's token, and the monotonic time at which
    its last grant or renewal was asked (the lease stands at least that long after)."""

    token: int
    granted_at: float
    lapsed: bool = False
    """Found run out at a renewal (the process was paused or stalled): never renewed
    again; the attempt goes on as the stale holder, its answer fenced by its token."""


class LeaseKeeper:
    """Renews held leases and settles owed writes, in one background task.

    >>> # keeper = LeaseKeeper(store, owner="gw-1", lease_seconds=30.0)
    >>> # await keeper.start(); keeper.hold(op.id, op.token, ...); ...; keeper.drop(op.id, op.token)

    Holds and debts belong to one attempt (operation id and token): an attempt
    that ends late, after the same process started a newer attempt of the key,
    must not let go of the newer one's lease or overwrite its owed receipt.
    """

    def __init__(
        self,
        store: Store,
        *,
        owner: str,
        lease_seconds: float,
        tombstone_seconds: float,
        clock: Clock = SYSTEM_CLOCK,
        graces: GraceClock | None = None,
    ) -> None:
        self._store = store
        self._clock = clock
        self._graces = graces
        self._owner = owner
        self._lease = lease_seconds
        self._tombstone = tombstone_seconds
        self._held: dict[str, _Hold] = {}
        self._unsent_claims: set[tuple[str, str]] = set()
        self._owed: dict[tuple[str, int], OwedWrite] = {}
        self._task: asyncio.Task[None] | None = None

    @property
    def owner(self) -> str:
        return self._owner

    def holds(self, operation_id: str) -> bool:
        return operation_id in self._held

    def hold(self, operation_id: str, token: int, *, scope: str, key: str, asked_at: float) -> None:
        """This process was granted attempt `token` (the claim was asked at `asked_at`,
        on this clock's monotonic time) and may send it.

        A granted claim also settles any debt for an earlier claim of the key
        whose commit failed: had that one landed, this one would have met it.
        """
        self._held[operation_id] = _Hold(token, asked_at)
        self._unsent_claims.discard((scope, key))

    def surely_holds(self, operation_id: str) -> bool:
        """True while the lease cannot have run out yet, by this host's monotonic clock.

        The store set the expiry after the grant (or renewal) was asked, so a
        lease asked for less than its length ago still stands: nobody else can
        have turned the record `unknown`. Past that, this process cannot tell.
        """
        hold = self._held.get(operation_id)
        return (
            hold is not None
            and not hold.lapsed
            and self._clock.monotonic() - hold.granted_at < self._lease
        )

    def drop(self, operation_id: str, token: int) -> None:
        """Attempt `token` ended: let its lease go (a newer attempt's hold stays)."""
        hold = self._held.get(operation_id)
        if hold is not None and hold.token == token:
            del self._held[operation_id]

    def claim_failed(self, scope: str, key: str) -> None:
        """The claim's commit failed: its outcome is unknown, but it was surely never sent."""
        self._unsent_claims.add((scope, key))

    def owe(self, operation_id: str, token: int, write: OwedWrite) -> None:
        """Retry attempt `token`'s outcome write once the store answers again."""
        self._owed[(operation_id, token)] = write

    @property
    def debts(self) -> int:
        return len(self._unsent_claims) + len(self._owed)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="lease-keeper")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self.debts:
            await self.settle_debts()

    async def _run(self) -> None:
        interval = max(self._lease / 3, 0.05)
        while True:
            await asyncio.sleep(interval)
            await self.upkeep()

    async def upkeep(self) -> None:
        """One round: renew the held leases, then pay what is owed (the loop's body,
        public so a simulation can run rounds on its own schedule).

        The renewal's reading of the store's clock is a witness (`GraceClock`). A
        lease found lapsed is not renewed (the store records it `lease-expired`);
        its attempt carries on only as a stale holder."""
        try:
            live = {op_id: hold.token for op_id, hold in self._held.items() if not hold.lapsed}
            if live:
                asked_at = self._clock.monotonic()
                renewal = await self._store.renew(
                    live, owner=self._owner, lease_seconds=self._lease
                )
                trusted = True
                if self._graces is not None:
                    steps = self._graces.steps_seen
                    self._graces.witness(renewal.at, before=asked_at, after=self._clock.monotonic())
                    # Renewed on a clock that stepped (or is back for a moment), the expiry
                    # the store wrote may already be past for everyone else: not surely
                    # held any more, until a renewal on a steady clock.
                    trusted = self._graces.steps_seen == steps and not self._graces.unsettled()
                granted = asked_at if trusted else -math.inf
                for operation_id in renewal.renewed:
                    hold = self._held.get(operation_id)
                    if hold is not None:
                        self._held[operation_id] = hold._replace(granted_at=granted)
                for operation_id in renewal.lapsed:
                    hold = self._held.get(operation_id)
                    if hold is not None:
                        self._held[operation_id] = hold._replace(lapsed=True)
                    log.warning(
                        "lease of %s found lapsed at renewal (this process was paused or "
                        "stalled); recorded lease-expired, the attempt goes on as a stale holder",
                        operation_id,
                        extra={"event": "lease_lapsed", "operation_id": operation_id},
                    )
            if self.debts:
                await self.settle_debts()
        except StoreUnavailable as exc:
            log.warning("store unavailable for lease upkeep: %s", exc.internal or exc.detail)

    async def settle_debts(self) -> None:
        """Pay what can be paid now; keep the rest for the next round."""
        for attempt, write in list(self._owed.items()):
            try:
                await write()
            except StoreUnavailable:
                return
            if self._owed.get(attempt) is write:  # not replaced by a newer debt meanwhile
                del self._owed[attempt]
        for scope, key in list(self._unsent_claims):
            try:
                await self._release_if_unsent(scope, key)
            except StoreUnavailable:
                return
            self._unsent_claims.discard((scope, key))

    async def _release_if_unsent(self, scope: str, key: str) -> None:
        operation = await self._store.get(scope, key)
        # Judged after the read, on what is true now: the read may have waited
        # while a later claim of the key was granted, sent, and let go.
        if (
            (scope, key) not in self._unsent_claims  # superseded by a granted claim
            or operation is None
            or operation.state is not State.IN_FLIGHT
            or operation.lease_owner != self._owner
            or operation.id in self._held  # an attempt of ours is live: it may be sent
            or (operation.id, operation.token) in self._owed  # sent: it owes its outcome
        ):
            return
        evidence = Evidence(
            at=self._clock.time(),
            source="gateway",
            detail="the claim's commit failed and the request was never sent",
        )
        await self._store.release(
            operation.id, operation.token, evidence, tombstone_seconds=self._tombstone
        )
        log.info("released never-sent claim %s after a store outage", operation.id)
