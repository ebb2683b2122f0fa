"""One suite of `Store` behaviours, run against every implementation.

Each test runs once per store kind (`[sqlite]`, `[postgres]`) on a fresh, empty
database: a new SQLite file, or a new PostgreSQL schema. Times are compared
with the store's own clock (`store.now()`), as the lifecycle does.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from pg import drop_schema, fresh_schema, require_postgres, url_for
from worker_stores import GatewayLock, TwoWorkers

from gateway.engine.calibration import MAX_KINDS, CalibrationChange, CalibrationState
from gateway.engine.history import verify_chain
from gateway.engine.lifecycle_events import answered_event, probe_event, sent_event
from gateway.engine.models import (
    ClaimRequest,
    Evidence,
    Existing,
    NewAttempt,
    Operation,
    Resolution,
    State,
    StoredResponse,
)
from gateway.store import Store
from gateway.store.base import OperationFilter, Page
from gateway.store.rows import claim_changes
from gateway.store.sqlite import SqliteStore

Reopen = Callable[[], Awaitable[Store]]
_REOPEN = pytest.StashKey[Reopen]()

RESPONSE = StoredResponse(
    status=201,
    headers=(
        ("content-type", "application/octet-stream"),
        ("x-repeated", "one"),
        ("X-Repeated", "two"),
        ("x-empty", ""),
        ("x-repeated", "three"),
    ),
    body=bytes(range(256)) + b"\r\n\x00\xff{}\xc3\x28",
)
OTHER_RESPONSE = StoredResponse(status=500, headers=(("content-type", "text/plain"),), body=b"x")


def same(operation: Operation | None) -> Operation | None:
    """An operation without `observed_at` (when it was read), to compare two reads of it."""
    return None if operation is None else operation._replace(observed_at=0.0)


class _Opener:
    """Opens stores of one kind on one database; the open one is closed at the end."""

    def __init__(self, make: Callable[[], Store]) -> None:
        self._make = make
        self._current: Store | None = None

    async def open(self) -> Store:
        await self.close()
        store = self._make()
        await store.open()
        self._current = store
        return store

    async def close(self) -> None:
        if self._current is not None:
            current, self._current = self._current, None
            await current.close()


@pytest_asyncio.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("sqlite-workers", id="sqlite-workers"),
        pytest.param("memory", id="memory"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    ]
)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """An open, empty store of each kind; closed (its schema dropped) after the test."""
    if request.param == "sqlite-workers":
        # Two workers of one gateway on one file (tests/worker_stores.py).
        lock = GatewayLock(tmp_path / "s.db")
        (tmp_path / "s.db").touch()
        opener = _Opener(lambda: TwoWorkers(lock))  # type: ignore[arg-type, return-value]
        request.node.stash[_REOPEN] = opener.open
        try:
            yield await opener.open()
        finally:
            await opener.close()
            lock.release()
        return
    if request.param in ("sqlite", "memory"):
        # memory: the simulation's store (tests/simulation); reopened on the same data.
        from tests.simulation.memory_store import MemoryDatabase, MemoryStore

        database = MemoryDatabase(time.time)
        opener = _Opener(
            (lambda: SqliteStore(path=tmp_path / "s.db", busy_timeout=1.0))
            if request.param == "sqlite"
            else (lambda: MemoryStore(database))
        )
        request.node.stash[_REOPEN] = opener.open
        try:
            yield await opener.open()
        finally:
            await opener.close()
        return

    postgres_store = require_postgres()
    schema = await fresh_schema()
    try:
        opener = _Opener(lambda: postgres_store(url_for(schema), pool_size=4))
        request.node.stash[_REOPEN] = opener.open
        try:
            yield await opener.open()
        finally:
            await opener.close()
    finally:
        await drop_schema(schema)


@pytest.fixture
def reopen(store: Store, request: pytest.FixtureRequest) -> Reopen:
    """Close `store` and open a new store of the same kind on the same database."""
    opener: Reopen = request.node.stash[_REOPEN]
    return opener


# -- helpers -------------------------------------------------------------------


def claim_request(
    key: str,
    *,
    scope: str = "s1",
    fingerprint: str = "sha256:aa",
    owner: str = "o1",
    lease_seconds: float = 30,
    tombstone_seconds: float = 3600,
    route: str = "r",
) -> ClaimRequest:
    return ClaimRequest(
        scope=scope,
        key=key,
        fingerprint=fingerprint,
        route=route,
        method="POST",
        path="/r/x",
        owner=owner,
        lease_seconds=lease_seconds,
        tombstone_seconds=tombstone_seconds,
    )


def evidence(detail: str = "timed out after sending") -> Evidence:
    return Evidence(at=time.time(), source="test", detail=detail, status=504, body_sha256="ab12")


def upstream() -> Resolution:
    return Resolution(by="upstream", at=time.time(), note="from upstream")


def assert_same_evidence(actual: Evidence, expected: Evidence) -> None:
    assert (actual.source, actual.detail, actual.status, actual.body_sha256) == (
        expected.source,
        expected.detail,
        expected.status,
        expected.body_sha256,
    )
    assert actual.at == pytest.approx(expected.at, abs=1e-3)


async def new_attempt(store: Store, key: str, **options: Any) -> Operation:
    result = await store.claim(claim_request(key, **options))
    assert isinstance(result, NewAttempt), result
    return result.operation


async def completed(
    store: Store,
    key: str,
    *,
    retention: float = 3600,
    tombstone: float = 7200,
    body_retained: bool = True,
) -> Operation:
    operation = await new_attempt(store, key)
    done = await store.complete(
        operation.id,
        operation.token,
        RESPONSE,
        body_retained=body_retained,
        retention_seconds=retention,
        tombstone_seconds=tombstone,
        resolution=upstream(),
    )
    assert done is not None
    return done


async def released(store: Store, key: str, *, tombstone: float = 3600) -> Operation:
    operation = await new_attempt(store, key)
    done = await store.release(
        operation.id, operation.token, evidence("connect refused"), tombstone_seconds=tombstone
    )
    assert done is not None
    return done


async def unknown(store: Store, key: str) -> Operation:
    operation = await new_attempt(store, key)
    done = await store.mark_unknown(operation.id, operation.token, evidence())
    assert done is not None
    return done


async def resolved(
    store: Store,
    operation: Operation,
    state: State,
    *,
    note: str | None = None,
    by: str = "admin",
    calibrated: tuple[str, str] | None = None,
) -> Operation | None:
    """A resolution of the operation's current attempt with no response (an admin's,
    unless `by` says whose; a probe's release names the calibration it obeyed)."""
    return await store.resolve(
        operation.id,
        token=operation.token,
        expected_version=None,
        state=state,
        response=None,
        resolution=Resolution(by=by, at=time.time(), note=note),
        retention_seconds=60,
        tombstone_seconds=60,
        calibrated=calibrated,
    )


async def state_of(store: Store, operation_id: str) -> State:
    operation = await store.get_by_id(operation_id)
    assert operation is not None
    return operation.state


# -- claim -----------------------------------------------------------------------


async def test_claim_of_a_new_key_is_a_leased_first_attempt(store: Store) -> None:
    """A new key is recorded in_flight, attempt 1, token 1, leased to the claimer."""
    before = await store.now()
    operation = await new_attempt(store, "k")
    after = await store.now()

    assert operation.id.startswith("op_")
    assert operation.state is State.IN_FLIGHT
    assert (operation.attempts, operation.token) == (1, 1)
    assert (operation.scope, operation.key, operation.fingerprint) == ("s1", "k", "sha256:aa")
    assert (operation.route, operation.method, operation.path) == ("r", "POST", "/r/x")
    assert operation.lease_owner == "o1"
    assert operation.lease_expires_at == pytest.approx(operation.created_at + 30, abs=0.5)
    assert before - 0.5 <= operation.created_at <= after + 0.5
    assert operation.response is None
    assert operation.evidence == ()


async def test_second_claim_of_a_key_reports_the_existing_operation(store: Store) -> None:
    """A second claim of the same (scope, key) gets `Existing` with the first operation."""
    first = await new_attempt(store, "k")

    again = await store.claim(claim_request("k", owner="o2"))

    assert isinstance(again, Existing)
    assert again.operation.id == first.id
    assert again.operation.state is State.IN_FLIGHT
    assert again.operation.lease_owner == "o1"


async def test_the_same_key_in_another_scope_is_another_operation(store: Store) -> None:
    """The same key in two scopes makes two independent operations."""
    first = await new_attempt(store, "k", scope="s1")
    second = await new_attempt(store, "k", scope="s2")

    assert second.id != first.id
    assert (second.attempts, second.token) == (1, 1)
    assert same(await store.get("s1", "k")) == same(first)
    assert same(await store.get("s2", "k")) == same(second)


async def test_concurrent_claims_of_one_key_make_one_new_attempt(store: Store) -> None:
    """Of 50 concurrent claims of one new key, exactly one gets `NewAttempt`."""
    results = await asyncio.gather(*(store.claim(claim_request("k")) for _ in range(50)))

    winners = [r.operation for r in results if isinstance(r, NewAttempt)]
    assert len(winners) == 1
    assert all(isinstance(r, Existing) for r in results if r.operation is not winners[0])
    assert {r.operation.id for r in results} == {winners[0].id}


async def test_concurrent_claims_over_many_keys_make_one_attempt_per_key(store: Store) -> None:
    """200 concurrent claims over 100 keys make exactly 100 `NewAttempt`s, one per key."""
    keys = [f"k{n}" for n in range(100)] * 2

    results = await asyncio.gather(*(store.claim(claim_request(key)) for key in keys))

    winners = Counter(r.operation.key for r in results if isinstance(r, NewAttempt))
    assert len(winners) == 100
    assert set(winners.values()) == {1}


async def test_concurrent_claims_of_a_released_key_make_one_new_attempt(store: Store) -> None:
    """Of 20 concurrent claims of a released key, exactly one starts attempt 2."""
    await released(store, "k")

    results = await asyncio.gather(*(store.claim(claim_request("k")) for _ in range(20)))

    winners = [r.operation for r in results if isinstance(r, NewAttempt)]
    assert len(winners) == 1
    assert (winners[0].attempts, winners[0].token) == (2, 2)


# -- complete ----------------------------------------------------------------------


async def test_complete_stores_the_receipt_byte_for_byte(store: Store) -> None:
    """Completing with the current token stores status, ordered headers and binary body."""
    operation = await new_attempt(store, "k")

    done = await store.complete(
        operation.id,
        operation.token,
        RESPONSE,
        body_retained=True,
        retention_seconds=60,
        tombstone_seconds=600,
        resolution=upstream(),
    )

    assert done is not None
    assert done.state is State.COMPLETED
    assert done.response == RESPONSE
    assert done.body_retained
    assert done.version > operation.version
    assert done.expires_at == pytest.approx(done.updated_at + 60, abs=0.5)
    assert done.forgotten_at == pytest.approx(done.updated_at + 600, abs=0.5)
    assert done.resolution is not None
    assert (done.resolution.by, done.resolution.note) == ("upstream", "from upstream")
    assert done.receipt_available()
    stored = await store.get("s1", "k")
    assert stored is not None
    assert stored.response == RESPONSE


async def test_a_receipt_is_never_overwritten(store: Store) -> None:
    """A second complete with the same token returns `None` and changes nothing."""
    done = await completed(store, "k")

    again = await store.complete(
        done.id,
        done.token,
        OTHER_RESPONSE,
        body_retained=True,
        retention_seconds=60,
        tombstone_seconds=600,
        resolution=upstream(),
    )

    assert again is None
    assert same(await store.get("s1", "k")) == same(done)


async def test_complete_with_a_stale_token_is_refused(store: Store) -> None:
    """Complete with a token that is not the current one returns `None`; still in_flight."""
    operation = await new_attempt(store, "k")

    refused = await store.complete(
        operation.id,
        operation.token + 1,
        RESPONSE,
        body_retained=True,
        retention_seconds=60,
        tombstone_seconds=600,
        resolution=upstream(),
    )

    assert refused is None
    current = await store.get("s1", "k")
    assert current is not None
    assert current.state is State.IN_FLIGHT
    assert current.response is None


async def test_a_response_too_large_to_keep_is_not_replayable(store: Store) -> None:
    """A receipt completed with `body_retained=False` keeps the status but is not replayable."""
    done = await completed(store, "k", body_retained=False)

    assert done.state is State.COMPLETED
    assert not done.body_retained
    assert done.response is not None
    assert done.response.status == RESPONSE.status
    assert not done.receipt_available()


# -- unknown and evidence -------------------------------------------------------------


async def test_mark_unknown_holds_the_key_and_keeps_the_evidence(store: Store) -> None:
    """mark_unknown with the current token makes the operation unknown with the evidence."""
    operation = await new_attempt(store, "k")
    learned = evidence()

    marked = await store.mark_unknown(operation.id, operation.token, learned)

    assert marked is not None
    assert marked.state is State.UNKNOWN
    assert len(marked.evidence) == 1
    assert_same_evidence(marked.evidence[0], learned)
    again = await store.claim(claim_request("k"))
    assert isinstance(again, Existing)
    assert again.operation.state is State.UNKNOWN


async def test_the_holder_of_an_unknown_attempt_still_records_its_answer(store: Store) -> None:
    """mark_unknown keeps the token: the attempt's holder, whose lease lapsed, still writes
    the real answer it received (its lease expiry is kept as the last send bound)."""
    operation = await new_attempt(store, "k")
    marked = await store.mark_unknown(operation.id, operation.token, evidence())
    assert marked is not None
    assert marked.token == operation.token
    assert marked.lease_expires_at == operation.lease_expires_at

    done = await store.complete(
        operation.id,
        operation.token,
        RESPONSE,
        body_retained=True,
        retention_seconds=60,
        tombstone_seconds=600,
        resolution=upstream(),
    )
    assert done is not None
    assert done.state is State.COMPLETED
    assert done.response == RESPONSE


async def test_the_holder_of_an_unknown_attempt_may_release_what_it_never_sent(
    store: Store,
) -> None:
    """A release under the unknown attempt's own token lands (the holder proved nothing left)."""
    operation = await new_attempt(store, "k")
    assert await store.mark_unknown(operation.id, operation.token, evidence()) is not None

    freed = await store.release(operation.id, operation.token, evidence(), tombstone_seconds=60)
    assert freed is not None
    assert freed.state is State.RELEASED


async def test_no_outcome_is_written_after_a_resolution(store: Store) -> None:
    """Once an unknown attempt is resolved (token bumped), its holder's late writes return
    `None` and change nothing."""
    operation = await new_attempt(store, "k")
    marked = await store.mark_unknown(operation.id, operation.token, evidence())
    assert marked is not None
    resolved = await store.resolve(
        marked.id,
        token=marked.token,
        expected_version=None,
        state=State.RELEASED,
        response=None,
        resolution=Resolution(by="admin", at=time.time()),
        retention_seconds=60,
        tombstone_seconds=600,
    )
    assert resolved is not None

    assert (
        await store.complete(
            operation.id,
            operation.token,
            RESPONSE,
            body_retained=True,
            retention_seconds=60,
            tombstone_seconds=600,
            resolution=upstream(),
        )
        is None
    )
    assert (
        await store.release(operation.id, operation.token, evidence(), tombstone_seconds=60) is None
    )
    assert await store.mark_unknown(operation.id, operation.token, evidence()) is None
    assert same(await store.get("s1", "k")) == same(resolved)


async def test_resolve_is_about_one_attempt(store: Store) -> None:
    """A resolve naming an attempt's token is refused once a newer attempt exists, even if
    that one is unknown too: a verdict about attempt 1 never settles attempt 2."""
    first = await unknown(store, "k")
    freed = await store.resolve(
        first.id,
        token=first.token,
        expected_version=None,
        state=State.RELEASED,
        response=None,
        resolution=Resolution(by="owner", at=time.time()),
        retention_seconds=60,
        tombstone_seconds=600,
    )
    assert freed is not None
    second = await new_attempt(store, "k")
    marked = await store.mark_unknown(second.id, second.token, evidence())
    assert marked is not None

    for stale in (first.token, freed.token):
        late = await store.resolve(
            first.id,
            token=stale,
            expected_version=None,
            state=State.RELEASED,
            response=None,
            resolution=Resolution(by="probe", at=time.time()),
            retention_seconds=60,
            tombstone_seconds=600,
        )
        assert late is None
    assert same(await store.get("s1", "k")) == same(marked)


async def test_mark_unknown_with_a_stale_token_is_refused(store: Store) -> None:
    """mark_unknown with a wrong token returns `None` and leaves the operation in_flight."""
    operation = await new_attempt(store, "k")

    assert await store.mark_unknown(operation.id, operation.token + 1, evidence()) is None
    current = await store.get("s1", "k")
    assert current is not None
    assert current.state is State.IN_FLIGHT


async def test_add_evidence_appends(store: Store) -> None:
    """add_evidence appends to the operation's evidence and keeps its version: an
    operator's If-Match (the ETag they read) is not spoiled by a probe's verdict."""
    marked = await unknown(store, "k")
    late = evidence("a late answer: 201")

    await store.add_evidence(marked.id, late)

    current = await store.get_by_id(marked.id)
    assert current is not None
    assert len(current.evidence) == len(marked.evidence) + 1
    assert_same_evidence(current.evidence[-1], late)
    assert current.version == marked.version
    assert current.state is State.UNKNOWN


async def test_a_repeated_fact_is_kept_once(store: Store) -> None:
    """Evidence that repeats the latest item but for its time (a background probe asking
    every few minutes and hearing the same "too soon") is not kept again: the record
    stays the size of what was learned, and the history's probe event counts the asks.
    A different fact is appended, and a fact is compared with the latest one only."""
    marked = await unknown(store, "k")
    for _ in range(3):
        await store.add_evidence(marked.id, evidence("probe: 404, too soon"))
    await store.add_evidence(marked.id, evidence("probe: 500"))
    await store.add_evidence(marked.id, evidence("probe: 404, too soon"))

    current = await store.get_by_id(marked.id)
    assert current is not None
    added = [item.detail for item in current.evidence[len(marked.evidence) :]]
    assert added == ["probe: 404, too soon", "probe: 500", "probe: 404, too soon"]
    assert current.version == marked.version


# -- release ---------------------------------------------------------------------------


async def test_release_lets_the_same_request_try_again(store: Store) -> None:
    """A released key claimed with the same fingerprint starts attempt 2 with token 2."""
    operation = await new_attempt(store, "k")
    done = await store.release(operation.id, operation.token, evidence(), tombstone_seconds=600)
    assert done is not None
    assert done.state is State.RELEASED
    assert done.forgotten_at == pytest.approx(done.updated_at + 600, abs=0.5)

    again = await new_attempt(store, "k", owner="o2")

    assert again.id == operation.id
    assert again.state is State.IN_FLIGHT
    assert (again.attempts, again.token) == (2, 2)
    assert again.lease_owner == "o2"
    stale = await store.complete(
        operation.id,
        operation.token,
        RESPONSE,
        body_retained=True,
        retention_seconds=60,
        tombstone_seconds=600,
        resolution=upstream(),
    )
    assert stale is None


async def test_a_released_key_stays_bound_to_its_fingerprint(store: Store) -> None:
    """A released key claimed with another fingerprint reports `Existing(released)`."""
    done = await released(store, "k")

    other = await store.claim(claim_request("k", fingerprint="sha256:bb"))

    assert isinstance(other, Existing)
    assert other.operation.id == done.id
    assert other.operation.state is State.RELEASED
    assert other.operation.fingerprint == "sha256:aa"


# -- leases ------------------------------------------------------------------------------


async def test_expired_leases_turn_unknown_and_live_ones_renew(store: Store) -> None:
    """Expired leases become unknown (on claim or expire_orphans); only live ones renew."""
    met = await new_attempt(store, "met", lease_seconds=0.2)
    orphan = await new_attempt(store, "orphan", lease_seconds=0.2)
    late = await new_attempt(store, "late", lease_seconds=0.2)
    live = await new_attempt(store, "live", lease_seconds=30)
    await asyncio.sleep(0.3)

    renewal = await store.renew({live.id: live.token}, owner="o1", lease_seconds=60)
    assert (renewal.renewed, renewal.lapsed) == ({live.id}, set())
    assert renewal.at == pytest.approx(await store.now(), abs=1)
    assert not (await store.renew({live.id: live.token + 1}, owner="o1", lease_seconds=60)).renewed
    assert not (await store.renew({live.id: live.token}, owner="o2", lease_seconds=60)).renewed
    renewed = await store.get_by_id(live.id)
    assert renewed is not None
    assert renewed.lease_expires_at == pytest.approx(await store.now() + 60, abs=1)

    claimed = await store.claim(claim_request("met"))
    assert isinstance(claimed, Existing)
    assert claimed.operation.id == met.id
    assert claimed.operation.state is State.UNKNOWN

    assert await store.expire_orphans(owner=None) == 2
    for expired in (orphan, late):
        current = await store.get_by_id(expired.id)
        assert current is not None
        assert current.state is State.UNKNOWN
        assert current.evidence, "the expiry is kept as evidence"
    still = await store.get_by_id(live.id)
    assert still is not None
    assert still.state is State.IN_FLIGHT
    assert await store.expire_orphans(owner=None) == 0


async def test_a_renewal_never_shortens_a_lease(store: Store) -> None:
    """A renewal asks for `lease_seconds` from the store's now; a record whose lease ends
    later keeps its end (a renewal read on a clock stepped back for a moment must not
    bring forward the window a release waits for)."""
    held = await new_attempt(store, "held", lease_seconds=600)
    renewal = await store.renew({held.id: held.token}, owner="o1", lease_seconds=60)
    assert renewal.renewed == {held.id}
    current = await store.get_by_id(held.id)
    assert current is not None
    assert current.lease_expires_at == pytest.approx(held.lease_expires_at, abs=1e-3)


async def test_a_lapsed_lease_is_never_renewed_silently(store: Store) -> None:
    """A renewal that finds its own lease run out while the record is still in flight
    records `lease-expired` (the record turns unknown, the token kept) instead of renewing
    it; the stale holder's answer is still written under its token."""
    late = await new_attempt(store, "late", lease_seconds=0.2)
    await asyncio.sleep(0.3)

    renewal = await store.renew({late.id: late.token}, owner="o1", lease_seconds=60)

    assert (renewal.renewed, renewal.lapsed) == (set(), {late.id})
    lapsed = await store.get_by_id(late.id)
    assert lapsed is not None
    assert (lapsed.state, lapsed.token) == (State.UNKNOWN, late.token)
    events = (await store.history(late.id)).events
    assert events[-1].type == "lease-expired"
    assert "lapsed" in json.loads(events[-1].data)["detail"]
    again = await store.renew({late.id: late.token}, owner="o1", lease_seconds=60)
    assert (again.renewed, again.lapsed) == (set(), set())
    completed = await store.complete(
        late.id,
        late.token,
        StoredResponse(201, (), b"late"),
        body_retained=True,
        retention_seconds=60,
        tombstone_seconds=60,
        resolution=Resolution(by="upstream", at=0.0),
    )
    assert completed is not None
    assert completed.state is State.COMPLETED


async def test_expire_orphans_of_a_dead_owner(store: Store) -> None:
    """expire_orphans(owner=X) turns all of X's in_flight records unknown, live or not."""
    dead = await new_attempt(store, "dead", owner="gone")
    alive = await new_attempt(store, "alive", owner="o1")

    assert await store.expire_orphans(owner="gone") == 1

    assert await state_of(store, dead.id) is State.UNKNOWN
    assert await state_of(store, alive.id) is State.IN_FLIGHT


# -- resolve ---------------------------------------------------------------------------------


async def test_resolve_applied_completes_an_unknown_operation(store: Store) -> None:
    """Resolving an unknown operation as applied stores the receipt and bumps the token."""
    marked = await unknown(store, "k")

    mismatch = await store.resolve(
        marked.id,
        token=marked.token,
        expected_version=marked.version + 5,
        state=State.COMPLETED,
        response=RESPONSE,
        resolution=Resolution(by="admin", at=time.time(), note="checked"),
        retention_seconds=60,
        tombstone_seconds=600,
    )
    assert mismatch is None

    done = await store.resolve(
        marked.id,
        token=marked.token,
        expected_version=marked.version,
        state=State.COMPLETED,
        response=RESPONSE,
        resolution=Resolution(by="admin", at=time.time(), note="checked"),
        retention_seconds=60,
        tombstone_seconds=600,
    )

    assert done is not None
    assert done.state is State.COMPLETED
    assert done.response == RESPONSE
    assert done.token == marked.token + 1
    assert done.version > marked.version
    assert done.resolution is not None
    assert (done.resolution.by, done.resolution.note) == ("admin", "checked")
    assert done.receipt_available()
    replay = await store.claim(claim_request("k"))
    assert isinstance(replay, Existing)
    assert replay.operation.response == RESPONSE

    again = await store.resolve(
        marked.id,
        token=marked.token,
        expected_version=None,
        state=State.RELEASED,
        response=None,
        resolution=Resolution(by="admin", at=time.time()),
        retention_seconds=60,
        tombstone_seconds=600,
    )
    assert again is None
    assert same(await store.get("s1", "k")) == same(done)


async def test_resolve_not_applied_releases_an_unknown_operation(store: Store) -> None:
    """Resolving an unknown operation as not applied releases it; the next attempt is 2."""
    marked = await unknown(store, "k")

    done = await store.resolve(
        marked.id,
        token=marked.token,
        expected_version=None,
        state=State.RELEASED,
        response=None,
        resolution=Resolution(by="owner", at=time.time(), note="not there"),
        retention_seconds=60,
        tombstone_seconds=600,
    )

    assert done is not None
    assert done.state is State.RELEASED
    assert done.response is None
    assert done.token == marked.token + 1
    assert done.forgotten_at is not None
    assert done.resolution is not None
    assert done.resolution.by == "owner"
    again = await new_attempt(store, "k")
    assert again.attempts == 2
    assert again.token == done.token + 1


async def test_resolve_touches_only_unknown_operations(store: Store) -> None:
    """Resolve returns `None` for an in_flight, completed or released operation."""
    operations = [
        await new_attempt(store, "flying"),
        await completed(store, "done"),
        await released(store, "freed"),
    ]

    for operation in operations:
        result = await store.resolve(
            operation.id,
            token=operation.token,
            expected_version=None,
            state=State.COMPLETED,
            response=OTHER_RESPONSE,
            resolution=Resolution(by="admin", at=time.time()),
            retention_seconds=60,
            tombstone_seconds=600,
        )
        assert result is None
        assert same(await store.get_by_id(operation.id)) == same(operation)


# -- lookups ------------------------------------------------------------------------------------


async def test_get_and_get_by_id_find_the_same_operation(store: Store) -> None:
    """get(scope, key) and get_by_id(id) return the same operation; unknown ones are `None`."""
    operation = await new_attempt(store, "k")

    assert same(await store.get("s1", "k")) == same(operation)
    assert same(await store.get_by_id(operation.id)) == same(operation)
    assert await store.get("s1", "nope") is None
    assert await store.get("s2", "k") is None
    assert await store.get_by_id("op_00000000000000000000000000") is None


async def test_complete_returns_the_operation_as_a_read_returns_it(store: Store) -> None:
    """What `complete` hands back (built from the receipt it wrote) equals a fresh read."""
    kept = await completed(store, "kept")
    dropped = await completed(store, "dropped", body_retained=False)

    assert same(kept) == same(await store.get("s1", "kept"))
    assert same(dropped) == same(await store.get("s1", "dropped"))
    assert dropped.response is not None
    assert dropped.response.body == b""


async def test_peek_receipt_answers_only_for_replayable_receipts(store: Store) -> None:
    """`peek_receipt` is `None` or exactly the receipt `get` holds, and only while it can
    be replayed: never for a key in flight, unknown, released, expired or not kept.

    PostgreSQL may always say `None` (its claim answers retries instead).
    """
    done = await completed(store, "done")
    await new_attempt(store, "flying")
    await unknown(store, "lost")
    await released(store, "freed")
    await completed(store, "gone", retention=0.1, tombstone=0.2)
    await completed(store, "expired", retention=0.1, tombstone=600)
    await completed(store, "not-kept", body_retained=False)
    await asyncio.sleep(0.3)

    peeked = store.peek_receipt("s1", "done")
    if peeked is not None:
        assert (peeked.operation_id, peeked.attempts, peeked.fingerprint) == (
            done.id,
            done.attempts,
            done.fingerprint,
        )
        assert peeked.response == done.response
    for key in ("flying", "lost", "freed", "gone", "expired", "not-kept", "never-used"):
        assert store.peek_receipt("s1", key) is None, key
    assert store.peek_receipt("s2", "done") is None
    if isinstance(store, SqliteStore):
        assert peeked is not None


async def test_list_operations_pages_by_state_in_creation_order(store: Store) -> None:
    """Listing unknown operations 3 at a time gives pages of 3, 3 and 1 in creation order."""
    wanted = []
    for n in range(7):
        wanted.append((await unknown(store, f"u{n}")).id)
        if n % 3 == 0:
            await new_attempt(store, f"f{n}")

    seen: list[str] = []
    sizes = []
    cursor = None
    while True:
        page = await store.list_operations(
            OperationFilter(state=State.UNKNOWN), limit=3, cursor=cursor
        )
        sizes.append(len(page.items))
        seen.extend(item.id for item in page.items)
        assert all(item.state is State.UNKNOWN for item in page.items)
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
        assert len(sizes) < 5, "pagination does not end"

    assert sizes == [3, 3, 1]
    assert seen == wanted
    everything = await store.list_operations(OperationFilter(), limit=100, cursor=None)
    assert len(everything.items) == 7 + 3
    assert everything.next_cursor is None


async def test_list_operations_filters_by_route_and_age(store: Store) -> None:
    """The console's filters: a route's operations, and those created at least N s ago."""
    # "new-a" must still be younger than the filter's age (1.5 s) when the filter is asked:
    # a window a loaded machine's store calls fit in (0.2 s, as it was, they need not).
    old_a = await new_attempt(store, "old-a", route="a")
    await new_attempt(store, "old-b", route="b")
    await asyncio.sleep(1.6)
    new_a = await new_attempt(store, "new-a", route="a")

    def ids(page: Page) -> list[str]:
        return [item.id for item in page.items]

    on_a = await store.list_operations(OperationFilter(route="a"), limit=10, cursor=None)
    assert ids(on_a) == [old_a.id, new_a.id]
    aged = await store.list_operations(
        OperationFilter(route="a", older_than=1.5), limit=10, cursor=None
    )
    assert ids(aged) == [old_a.id]
    aged_any_route = await store.list_operations(
        OperationFilter(older_than=1.5), limit=10, cursor=None
    )
    assert len(aged_any_route.items) == 2
    assert (
        ids(await store.list_operations(OperationFilter(older_than=3600), limit=10, cursor=None))
        == []
    )
    assert ids(await store.list_operations(OperationFilter(route="c"), limit=10, cursor=None)) == []
    in_flight_on_a = await store.list_operations(
        OperationFilter(state=State.IN_FLIGHT, route="a"), limit=1, cursor=None
    )
    assert ids(in_flight_on_a) == [old_a.id]
    assert in_flight_on_a.next_cursor is not None


async def test_redact_acts_only_on_the_version_read(store: Store) -> None:
    """An operator redacts the version they read: a later version is left alone."""
    done = await completed(store, "k")
    assert await store.redact(done.id, redaction(), expected_version=done.version + 1) is None
    untouched = await store.get_by_id(done.id)
    assert untouched is not None
    assert untouched.response == done.response
    assert untouched.version == done.version

    erased = await store.redact(done.id, redaction(), expected_version=done.version)
    assert erased is not None
    assert erased.version == done.version + 1
    assert erased.response is not None
    assert erased.response.body == b""
    assert await store.redact(done.id, redaction(), expected_version=done.version) is None


def redaction() -> Evidence:
    return Evidence(at=time.time(), source="redaction", detail="receipt erased by admin: test")


async def test_list_operations_rejects_an_invalid_cursor(store: Store) -> None:
    """A cursor the store did not make raises `ValueError`."""
    # The message is each store's own; the type is the contract.
    with pytest.raises(ValueError):  # noqa: PT011
        await store.list_operations(OperationFilter(), limit=3, cursor="not a cursor!")


async def test_list_operations_finds_a_key_in_every_scope(store: Store) -> None:
    """`key=` lists that key's operations in every scope, in creation order, pages and the
    state filter included; nothing else matches it (no prefix, no LIKE pattern)."""
    first = await unknown(store, "shared")
    await new_attempt(store, "shared-not")
    await new_attempt(store, "other", scope="s2")
    second = await new_attempt(store, "shared", scope="s2")
    third = await new_attempt(store, "shared", scope="s3")
    await new_attempt(store, "sh%")

    page = await store.list_operations(OperationFilter(key="shared"), limit=10, cursor=None)
    assert [item.id for item in page.items] == [first.id, second.id, third.id]
    assert {item.scope for item in page.items} == {"s1", "s2", "s3"}
    assert page.next_cursor is None

    seen: list[str] = []
    cursor = None
    for _ in range(4):
        page = await store.list_operations(OperationFilter(key="shared"), limit=2, cursor=cursor)
        seen.extend(item.id for item in page.items)
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == [first.id, second.id, third.id]

    unknowns = await store.list_operations(
        OperationFilter(state=State.UNKNOWN, key="shared"), limit=10, cursor=None
    )
    assert [item.id for item in unknowns.items] == [first.id]
    nothing = await store.list_operations(OperationFilter(key="s%"), limit=10, cursor=None)
    assert nothing.items == ()
    assert (await store.list_operations(OperationFilter(key=""), limit=10, cursor=None)).items == ()


# -- retention -------------------------------------------------------------------------------------


async def test_sweep_drops_bodies_then_tombstones_but_never_unknown(store: Store) -> None:
    """Sweep drops an expired receipt's body, later forgets tombstones, and keeps unknown."""
    # The first sweep must come between the body's expiry (0.2 s) and the tombstones' (2 s),
    # on the store's clock, which no test can hold still: a window wide enough for a loaded
    # machine (0.4 s was not: a sweep 0.4 s late forgot the tombstones too).
    done = await completed(store, "done", retention=0.2, tombstone=2.0)
    freed = await released(store, "freed", tombstone=2.0)
    marked = await unknown(store, "marked")

    await asyncio.sleep(0.3)
    report = await store.sweep(batch=100)
    assert (report.receipts_expired, report.forgotten) == (1, 0)
    expired = await store.get("s1", "done")
    assert expired is not None
    assert expired.state is State.COMPLETED
    assert expired.body_retained
    assert not expired.receipt_available()
    # The record itself says the body is gone, whatever the reader's clock says: read
    # by a clock stepped back before the expiry, it still replays nothing.
    assert expired.response is None
    assert not expired._replace(observed_at=done.observed_at).receipt_available()
    assert await store.get("s1", "freed") is not None

    await asyncio.sleep(1.8)  # past the tombstones (2 s)
    report = await store.sweep(batch=100)
    assert (report.receipts_expired, report.forgotten) == (0, 2)
    for gone in (done, freed):
        assert await store.get("s1", gone.key) is None
        assert await store.get_by_id(gone.id) is None
    kept = await store.get("s1", "marked")
    assert kept is not None
    assert kept.state is State.UNKNOWN
    assert kept.id == marked.id


async def test_sweep_is_bounded_by_its_batch(store: Store) -> None:
    """sweep(batch=2) expires at most 2 receipts and forgets at most 2 tombstones per pass."""
    for n in range(3):
        await completed(store, f"done{n}", retention=0.1, tombstone=3600)
        await released(store, f"freed{n}", tombstone=0.1)
    await asyncio.sleep(0.2)

    reports = [await store.sweep(batch=2) for _ in range(3)]

    assert [(r.receipts_expired, r.forgotten) for r in reports] == [(2, 2), (1, 1), (0, 0)]


async def test_a_forgotten_key_starts_over(store: Store) -> None:
    """A key past its forgotten_at is claimed again as a fresh first attempt."""
    await completed(store, "done", retention=0.1, tombstone=0.2)
    await released(store, "freed", tombstone=0.2)
    await asyncio.sleep(0.3)

    again = await new_attempt(store, "done")
    other = await new_attempt(store, "freed", fingerprint="sha256:bb")

    for operation in (again, other):
        assert operation.state is State.IN_FLIGHT
        assert operation.attempts == 1
        assert operation.response is None
        assert operation.evidence == ()
    assert other.fingerprint == "sha256:bb"


async def test_concurrent_claims_of_a_forgotten_key_make_one_new_attempt(store: Store) -> None:
    """Of concurrent claims of a forgotten key, one starts over and the rest see its claim."""
    keys = [f"k{n}" for n in range(20)]
    for key in keys:
        await completed(store, key, retention=0.1, tombstone=0.2)
    await asyncio.sleep(0.3)

    # Claims of one key are issued together so that some wait on the row lock while
    # the winner deletes the tombstone and inserts the new row: they must then report
    # that new row, not fail (PostgreSQL raised StoreUnavailable here).
    results = await asyncio.gather(
        *(store.claim(claim_request(key)) for key in keys for _ in range(10)),
        return_exceptions=True,
    )

    errors = [r for r in results if isinstance(r, BaseException)]
    assert errors == []
    for key in keys:
        mine = [r for r in results if not isinstance(r, BaseException) and r.operation.key == key]
        winners = [r.operation for r in mine if isinstance(r, NewAttempt)]
        assert len(winners) == 1
        assert winners[0].attempts == 1
        assert {r.operation.id for r in mine} == {winners[0].id}


async def test_a_tombstone_outlives_its_receipt(store: Store) -> None:
    """A tombstone shorter than the retention is stretched to it: forgotten_at >= expires_at."""
    done = await completed(store, "k", retention=600, tombstone=60)

    assert done.expires_at is not None
    assert done.forgotten_at is not None
    assert done.forgotten_at >= done.expires_at


# -- the rest of the protocol ---------------------------------------------------------------------


async def test_count_by_state_counts_every_state(store: Store) -> None:
    """count_by_state names all four states, with zeros, and counts each one."""
    assert await store.count_by_state() == dict.fromkeys(State, 0)

    await new_attempt(store, "f1")
    await new_attempt(store, "f2")
    await completed(store, "c")
    await unknown(store, "u1")
    await unknown(store, "u2")
    await unknown(store, "u3")
    await released(store, "r")

    assert await store.count_by_state() == {
        State.IN_FLIGHT: 2,
        State.COMPLETED: 1,
        State.UNKNOWN: 3,
        State.RELEASED: 1,
    }


async def test_scope_secret_is_long_and_survives_a_restart(store: Store, reopen: Reopen) -> None:
    """The scope secret has 32+ bytes and is the same after the store is reopened."""
    secret = await store.scope_secret()
    assert len(secret) >= 32
    assert await store.scope_secret() == secret

    reopened = await reopen()

    assert await reopened.scope_secret() == secret


async def test_clock_witnesses_are_kept_per_host_across_a_restart(
    store: Store, reopen: Reopen
) -> None:
    """A host's clock witness reads back as last written, after a reopen too; hosts apart,
    and nothing else of the store's own rows among them."""
    assert await store.read_clock_witnesses() == {}
    await store.write_clock_witness("boot-a", b'{"n": 1}')
    await store.write_clock_witness("boot-a", b'{"n": 2}')
    await store.write_clock_witness("boot-b", b'{"n": 3}')

    reopened = await reopen()

    assert await reopened.read_clock_witnesses() == {"boot-a": b'{"n": 2}', "boot-b": b'{"n": 3}'}


async def test_ping_and_clock(store: Store) -> None:
    """ping succeeds on an open store and now() is within a few seconds of the host clock."""
    await store.ping()
    assert abs(await store.now() - time.time()) < 5


# -- SQLite only: its read-only connection ---------------------------------------


async def test_sqlite_reads_fall_back_to_the_writer_when_the_reader_fails(tmp_path: Path) -> None:
    """A read the loop's read-only connection cannot serve goes through the writer instead."""
    store = SqliteStore(path=tmp_path / "s.db", busy_timeout=1.0)
    await store.open()
    try:
        done = await completed(store, "k")
        reader = store._reader
        assert reader is not None
        reader.close()  # every statement on it now raises sqlite3.ProgrammingError

        assert same(await store.get("s1", "k")) == same(done)
        assert same(await store.get_by_id(done.id)) == same(done)
        assert store.peek_receipt("s1", "k") is None  # "ask claim" instead
        again = await store.claim(claim_request("k"))
        assert isinstance(again, Existing)
        assert same(again.operation) == same(done)
    finally:
        await store.close()


async def test_sqlite_peek_sees_committed_writes_only(tmp_path: Path) -> None:
    """Between a batch's UPDATE (on the loop) and its COMMIT (on the thread), the reader
    still sees the claim: a receipt is never replayed before it is durable."""
    store = SqliteStore(path=tmp_path / "s.db", busy_timeout=1.0)
    await store.open()
    release_commit = threading.Event()
    try:
        operation = await new_attempt(store, "k")
        commit_thread = store._writer._thread
        assert commit_thread is not None
        # Hold the commit thread so the next batch's COMMIT waits behind this call.
        commit_thread.submit(lambda: release_commit.wait(10), lambda result, error: None)
        writing = asyncio.ensure_future(
            store.complete(
                operation.id,
                operation.token,
                RESPONSE,
                body_retained=True,
                retention_seconds=60,
                tombstone_seconds=600,
                resolution=upstream(),
            )
        )
        await asyncio.sleep(0.05)  # the UPDATE has run on the loop; its COMMIT is queued

        assert not writing.done()
        assert store.peek_receipt("s1", "k") is None
        current = await store.get("s1", "k")
        assert current is not None
        assert current.state is State.IN_FLIGHT

        release_commit.set()
        done = await writing
        peeked = store.peek_receipt("s1", "k")
        assert peeked is not None
        assert peeked.response == done.response
    finally:
        release_commit.set()
        await store.close()


def test_claim_changes_only_forgotten_same_released_and_lapsed_records() -> None:
    """The rule both stores use to answer a claim of an existing key from a plain read."""
    now = 1_000.0
    base = Operation(
        id="op_1", scope="s1", key="k", state=State.COMPLETED, route="r", method="POST",
        path="/p", fingerprint="sha256:aa", attempts=1, token=1, version=2,
        created_at=now - 10, updated_at=now - 5, forgotten_at=now + 60, observed_at=now,
    )  # fmt: skip
    cases = [
        (base, "sha256:aa", False),  # a retry of a completed key: reported
        (base, "sha256:bb", False),  # a mismatch: reported (the engine answers 422)
        (base._replace(forgotten_at=now - 1), "sha256:aa", True),  # starts over
        (base._replace(state=State.RELEASED), "sha256:aa", True),  # a new attempt
        (base._replace(state=State.RELEASED), "sha256:bb", False),  # bound elsewhere
        (base._replace(state=State.UNKNOWN, forgotten_at=None), "sha256:aa", False),
        (base._replace(state=State.IN_FLIGHT, lease_expires_at=now + 5), "sha256:aa", False),
        (base._replace(state=State.IN_FLIGHT, lease_expires_at=now), "sha256:aa", True),
    ]
    for operation, fingerprint, expected in cases:
        request = claim_request("k")._replace(fingerprint=fingerprint)
        assert claim_changes(operation, request) is expected, (operation, fingerprint)
    # A key bound before fingerprints were version 2 is the same request by its old form.
    old_form = base._replace(state=State.RELEASED, fingerprint="sha256:aa")
    upgraded = claim_request("k")._replace(
        fingerprint="v2:sha256:cc", legacy_fingerprint="sha256:aa"
    )
    assert claim_changes(old_form, upgraded) is True
    assert claim_changes(old_form, upgraded._replace(legacy_fingerprint="sha256:bb")) is False


async def test_identical_probe_verdicts_are_one_event_with_a_count(store: Store) -> None:
    """A probe that keeps giving the same verdict about the same attempt leaves one event
    with a count (the chain's head, rewritten with it); another verdict is a new event.
    The chain verifies either way, and evidence changes no version."""
    marked = await unknown(store, "k")
    same = probe_event("not_applied_too_soon", status=404, detail="too soon")
    for _ in range(3):
        await store.add_evidence(marked.id, evidence("probe: 404"), (same,))
    await store.add_evidence(
        marked.id, evidence("probe: 200"), (probe_event("error", status=500, detail="x"),)
    )
    current = await store.get_by_id(marked.id)
    assert current is not None
    assert current.version == marked.version
    page = await store.history(marked.id)
    probes = [json.loads(row.data) for row in page.events if row.type == "probe"]
    assert [(p["verdict"], p.get("count", 1)) for p in probes] == [
        ("not_applied_too_soon", 3),
        ("error", 1),
    ]
    report = verify_chain(
        page.events,
        head=current.history_head,
        head_seq=current.history_seq,
        payloads=page.payloads,
    )
    assert report.ok, report


async def test_a_receipt_and_its_events_are_written_together_and_fenced(store: Store) -> None:
    """The hot path's receipt with its `sent` and `answered` events (on PostgreSQL one
    statement whose chain the database computes): a stale token writes neither; the
    current one writes both, after the claim's event, and the chain verifies."""
    operation = await new_attempt(store, "k")
    events = (
        sent_event(operation.token, operation.id, attempt=operation.attempts),
        answered_event(201, attempt=operation.attempts),
    )

    async def write(token: int) -> Operation | None:
        return await store.complete(
            operation.id, token, RESPONSE, body_retained=True, retention_seconds=3600,
            tombstone_seconds=7200, resolution=upstream(), events=events,
        )  # fmt: skip

    assert await write(operation.token + 1) is None
    done = await write(operation.token)
    assert done is not None
    assert (done.state, done.version, done.history_seq) == (State.COMPLETED, 2, 3)
    page = await store.history(operation.id)
    assert [row.type for row in page.events] == ["claimed", "sent", "answered"]
    assert {row.version for row in page.events[1:]} == {2}
    assert done.history_head == page.events[-1].hash
    report = verify_chain(
        page.events, head=done.history_head, head_seq=done.history_seq, payloads=page.payloads
    )
    assert report.ok, report


# -- what a probe can see: calibration rows and samples (third round) ----------------------


async def calibrate(store: Store, state: CalibrationState, kind: str = "POST /*/x") -> None:
    change = CalibrationChange("r", kind, state, "calibration", f"made {state.value}")
    if state is CalibrationState.TRUSTED:
        change = change._replace(note="checked by hand", trust_seconds=3600)
    assert await store.save_calibration(change) is not None


async def resolve_by_probe(store: Store, operation: Operation) -> Operation | None:
    return await resolved(
        store, operation, State.RELEASED, by="probe", calibrated=("r", "POST /*/x")
    )


async def test_a_probes_release_needs_the_kinds_calibration_as_the_store_reads_it(
    store: Store,
) -> None:
    """`resolve(calibrated=...)` applies only while the kind's row admits a release (a
    calibration under an hour old, or an unexpired trust): no row, or a blind one,
    refuses it inside the releasing transaction."""
    operation = await unknown(store, "k")
    assert await resolve_by_probe(store, operation) is None  # no row: never calibrated
    await calibrate(store, CalibrationState.BLIND)
    assert await resolve_by_probe(store, operation) is None
    await calibrate(store, CalibrationState.TRUSTED)
    released = await resolve_by_probe(store, operation)
    assert released is not None
    assert released.state is State.RELEASED
    other = await unknown(store, "k2")
    await calibrate(store, CalibrationState.CALIBRATED)
    assert await resolve_by_probe(store, other) is not None


async def test_calibration_rows_keep_their_transitions_and_are_capped_per_route(
    store: Store,
) -> None:
    """A row keeps its transitions (a state change, or a person's note); a confirmation
    refreshes it without one; past `MAX_KINDS` kinds a route gets no new row."""
    await calibrate(store, CalibrationState.CALIBRATED)
    await calibrate(store, CalibrationState.CALIBRATED)  # a confirmation
    await calibrate(store, CalibrationState.BLIND)
    await calibrate(store, CalibrationState.TRUSTED)
    [row] = await store.calibrations("r")
    assert row.state is CalibrationState.TRUSTED
    assert row.until is not None
    assert row.note == "checked by hand"
    assert [event["state"] for event in row.events] == ["calibrated", "blind", "trusted"]
    for n in range(MAX_KINDS - 1):
        await calibrate(store, CalibrationState.CALIBRATED, kind=f"POST /*/k{n}")
    extra = CalibrationChange("r", "POST /*/one-too-many", CalibrationState.CALIBRATED, "c", "d")
    assert await store.save_calibration(extra) is None
    assert len(await store.calibrations("r")) == MAX_KINDS
    assert await store.calibrations("other") == ()


async def test_calibration_samples_are_recent_2xx_answers_of_the_kind(store: Store) -> None:
    """Samples: operations of the kind (in the scope, when given) that the upstream
    completed with a 2xx, completed at `completed_since` or later, newest first; and the
    route's kinds."""

    def kind(key: str, *, scope: str = "s1", request_kind: str = "POST /*/x") -> ClaimRequest:
        return claim_request(key, scope=scope)._replace(kind=request_kind)

    async def done(request: ClaimRequest, response: StoredResponse = RESPONSE) -> Operation:
        claimed = await store.claim(request)
        assert isinstance(claimed, NewAttempt)
        operation = claimed.operation
        completed = await store.complete(
            operation.id,
            operation.token,
            response,
            body_retained=True,
            retention_seconds=60,
            tombstone_seconds=60,
            resolution=upstream(),
        )
        assert completed is not None
        return completed

    first = await done(kind("a"))
    await done(kind("b", scope="s2"))
    await done(kind("c"), OTHER_RESPONSE)  # a 500: never a sample
    await done(kind("d", request_kind="POST /*/y"))
    await unknown(store, "e")
    later = await done(kind("f"))
    samples = await store.calibration_samples(
        route="r", kind="POST /*/x", scope="s1", completed_since=None, limit=10
    )
    assert [sample.key for sample in samples] == ["f", "a"]
    every_scope = await store.calibration_samples(
        route="r", kind="POST /*/x", scope=None, completed_since=None, limit=10
    )
    assert {sample.key for sample in every_scope} == {"a", "b", "f"}
    recent = await store.calibration_samples(
        route="r", kind="POST /*/x", scope="s1", completed_since=later.updated_at, limit=10
    )
    assert [sample.key for sample in recent] == ["f"]
    assert first.key == "a"
    assert set(await store.route_kinds("r", limit=10)) == {"POST /*/x", "POST /*/y"}


async def test_the_latest_operation_of_a_request_is_found_whatever_its_key(store: Store) -> None:
    """`latest_of_request` finds the latest operation of a request (scope, route and
    fingerprint in any form given), whatever its key and state; none in another scope."""
    await completed(store, "first")
    second = await unknown(store, "second")
    found = await store.latest_of_request(scope="s1", route="r", fingerprints=("sha256:aa",))
    assert found is not None
    assert found.id == second.id
    either = await store.latest_of_request(
        scope="s1", route="r", fingerprints=("v2:sha256:zz", "sha256:aa")
    )
    assert either is not None
    assert either.id == second.id
    assert await store.latest_of_request(scope="s2", route="r", fingerprints=("sha256:aa",)) is None


async def test_a_late_answer_completes_a_release_it_proves_wrong(store: Store) -> None:
    """`complete_late`: an attempt's answer after its operation was released (no newer
    attempt) completes it, by the upstream; after a newer attempt it changes nothing."""
    operation = await unknown(store, "k")
    released = await resolved(store, operation, State.RELEASED, note="forced")
    assert released is not None
    late = await store.complete_late(
        operation.id,
        operation.attempts,
        RESPONSE,
        body_retained=True,
        retention_seconds=60,
        tombstone_seconds=60,
    )
    assert late is not None
    assert late.state is State.COMPLETED
    assert late.resolution is not None
    assert late.resolution.by == "upstream"
    assert late.response is not None
    assert late.response.body == RESPONSE.body

    again = await unknown(store, "k2")
    gone = await resolved(store, again, State.RELEASED)
    assert gone is not None
    retried = await store.claim(claim_request("k2"))
    assert isinstance(retried, NewAttempt)  # attempt 2 began: attempt 1's answer is evidence
    assert (
        await store.complete_late(
            again.id, 1, RESPONSE, body_retained=True, retention_seconds=60, tombstone_seconds=60
        )
        is None
    )


async def test_a_late_answer_fills_an_applied_resolution_without_a_receipt(store: Store) -> None:
    """An operator's `applied` without a response gets the late answer as its receipt; the
    resolution stays the operator's. One with a receipt is never changed."""
    operation = await unknown(store, "k")
    applied = await resolved(store, operation, State.COMPLETED, note="seen in the CRM")
    assert applied is not None
    filled = await store.complete_late(
        operation.id, 1, RESPONSE, body_retained=True, retention_seconds=60, tombstone_seconds=60
    )
    assert filled is not None
    assert filled.response is not None
    assert filled.resolution is not None
    assert (filled.resolution.by, filled.resolution.note) == ("admin", "seen in the CRM")
    assert (
        await store.complete_late(
            operation.id, 1, OTHER_RESPONSE, body_retained=True, retention_seconds=60,
            tombstone_seconds=60,
        )
        is None
    )  # fmt: skip


async def test_a_key_bound_before_version_2_is_the_same_request_in_its_old_form(
    store: Store,
) -> None:
    """A released key bound with a version-1 fingerprint starts a new attempt for a
    request whose old form matches it (`ClaimRequest.legacy_fingerprint`)."""
    old = await released(store, "k")
    assert old.fingerprint == "sha256:aa"
    upgraded = claim_request("k")._replace(
        fingerprint="v2:sha256:cc", legacy_fingerprint="sha256:aa"
    )
    again = await store.claim(upgraded)
    assert isinstance(again, NewAttempt), again
    assert again.operation.attempts == 2
