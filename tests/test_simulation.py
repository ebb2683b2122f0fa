"""The deterministic simulation (tests/simulation): a bounded run, replay, and proof it bites.

The long hunt is `make simulate` (10 minutes of seeds); here a short,
bounded run keeps every invariant in the normal suite, one seed is replayed
to show a failure can be reproduced exactly, and deliberately broken stores
show that each invariant catches the bug it claims to catch.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from gateway.engine.models import (
    ClaimRequest,
    Evidence,
    NewAttempt,
    Operation,
    Resolution,
    Similar,
    SimilarGuard,
    State,
    StoredResponse,
)
from gateway.engine.twins import BINDING_SWEEP_SLACK
from gateway.store.base import SweepReport
from tests.simulation import InvariantViolation, Scenario, Simulation
from tests.simulation.clock import WorldClock
from tests.simulation.memory_store import Binding, MemoryDatabase, MemoryStore
from tests.simulation.simulator import StoreFactory

KNOWN_ENGINE_BUGS = frozenset({"other-operation"})
"""Answer-state mismatch classes the simulation found in the engine and that are not
fixed yet; the bounded run counts them instead of failing. Remove a class once fixed.

`other-operation`: a request outlives its key's tombstone (its probe or a parked store
call returns after the record was forgotten and the key bound anew) and is answered
from the forgotten record: a conservative `unknown` or a 422, never a second effect.
It needs `tombstone_retention` shorter than one request's life (default 30 days)."""

RUN_SECONDS = 20.0
RUN_SEEDS = 800
HUNT_SEEDS = 300
HUNT_SECONDS = 10.0


def simulate(seed: int, **options: Any) -> Simulation:
    steps = options.pop("steps", None)
    return Simulation(Scenario.draw(seed, steps=steps), **options)


def hunt(
    store_factory: StoreFactory, *, draw: Callable[..., Scenario] = Scenario.draw, **focus: Any
) -> InvariantViolation:
    """Run seeds against a broken store until one fails (bounded in seeds and time).

    `focus` overrides the drawn scenario (fewer unrelated faults) for bugs that need a
    rare interleaving; `draw` makes the scenarios (`Scenario.losing_keys`: agents that
    lose their keys).
    """
    deadline = time.monotonic() + HUNT_SECONDS
    for seed in range(1, HUNT_SEEDS + 1):
        scenario = dataclasses.replace(draw(seed, steps=300), **focus)
        simulation = Simulation(scenario, store_factory=store_factory, tolerate=KNOWN_ENGINE_BUGS)
        try:
            asyncio.run(simulation.run())
        except InvariantViolation as violation:
            return violation
        if time.monotonic() > deadline:
            break
    pytest.fail(f"no seed up to {seed} noticed the broken store")


def test_a_bounded_run_of_seeds_keeps_every_invariant() -> None:
    """Seeds 1, 2, ... (bounded in count and time) keep every invariant after every step."""
    deadline = time.monotonic() + RUN_SECONDS
    steps = 0
    for seed in range(1, RUN_SEEDS + 1):
        report = asyncio.run(simulate(seed, tolerate=KNOWN_ENGINE_BUGS).run())
        steps += report.steps
        if time.monotonic() > deadline:
            break
    assert steps > 10_000


LOST_KEY_SEEDS = 60
LOST_KEY_SECONDS = 10.0
GUARD_OFF_SEEDS = 10


def test_agents_that_lose_their_keys_make_no_second_effect() -> None:
    """Agents that send some retries under a fresh key (`Scenario.losing_keys`: the same
    request, some marked distinct) keep every invariant, `twin-effect` included, and the
    run met the guard: refusals, bindings, requests marked distinct beside their twin.
    With the guard on, no claim goes ahead beside an unsettled twin, or under a key a
    refusal bound to its twin, unless distinct."""
    deadline = time.monotonic() + LOST_KEY_SECONDS
    steps = 0
    twins: Counter[str] = Counter()
    for seed in range(1, LOST_KEY_SEEDS + 1):
        scenario = Scenario.losing_keys(seed)
        report = asyncio.run(Simulation(scenario, tolerate=KNOWN_ENGINE_BUGS).run())
        steps += report.steps
        twins.update(report.twins)
        if time.monotonic() > deadline:
            break
    assert steps > 5_000
    assert twins["refused similar-operation"] > 0, twins
    assert twins["bind (binding write)"] > 0, twins
    assert twins["claimed distinct beside an unsettled twin"] > 0, twins
    assert twins["claimed beside an unsettled twin"] == 0, twins
    assert twins["claimed under a key bound to its twin"] == 0, twins


def test_twin_effect_catches_a_gateway_without_the_guard() -> None:
    """The same agents in front of a route with `similar_guard = "off"`: the invariant
    names the second effect (the proof it would catch a broken guard)."""
    caught: list[InvariantViolation] = []
    for seed in range(1, GUARD_OFF_SEEDS + 1):
        scenario = dataclasses.replace(Scenario.losing_keys(seed), similar_guard="off")
        try:
            asyncio.run(Simulation(scenario, tolerate=KNOWN_ENGINE_BUGS).run())
        except InvariantViolation as violation:
            if any(problem.invariant == "twin-effect" for problem in violation.problems):
                caught.append(violation)
    assert caught, f"no seed up to {GUARD_OFF_SEEDS} noticed the missing guard"
    message = str(caught[0])
    assert "without the distinct marker" in message
    assert "--lost-keys --similar-guard off" in message


FOUND_ENGINE_BUGS = (2, 9, 16, 23, 25, 6689, 28618)
"""Seeds that once failed against the engine (each fixed since, see the git log). A
change to the engine or the simulator may steer a seed elsewhere, so these are a cheap
extra net, not the proof: the proof is the fix's own test."""


@pytest.mark.parametrize("seed", FOUND_ENGINE_BUGS)
def test_seeds_that_found_engine_bugs_keep_every_invariant(seed: int) -> None:
    """Each seed that once broke an invariant runs clean now."""
    asyncio.run(simulate(seed, tolerate=KNOWN_ENGINE_BUGS).run())


@pytest.mark.parametrize("lost_keys", [False, True], ids=["keys-kept", "keys-lost"])
def test_a_seed_replays_identically(lost_keys: bool) -> None:
    """The same seed makes the same trace, step for step, every time it runs."""
    traces = []
    for _ in range(2):
        scenario = (Scenario.losing_keys if lost_keys else Scenario.draw)(7)
        simulation = Simulation(scenario, keep_trace=True, tolerate=KNOWN_ENGINE_BUGS)
        report = asyncio.run(simulation.run())
        traces.append((simulation.full_trace, report.trace_digest))
    assert traces[0] == traces[1]
    assert traces[0][0] is not None
    assert len(traces[0][0]) > 200


def test_a_violation_names_the_seed_the_step_and_the_trace() -> None:
    """A failing run reports its seed, the replay command and the last steps of its trace."""
    violation = hunt(TokenBlindStore)
    message = str(violation)
    assert f"seed {violation.seed}: invariant violated at step {violation.step}" in message
    assert f"python -m tests.simulation --seed {violation.seed}" in message
    assert len(violation.trace) > 10


# -- deliberately broken stores: each invariant must notice its bug ------------------------------


class TokenBlindStore(MemoryStore):
    """Applies every fenced write whatever token the writer holds."""

    def __init__(self, database: MemoryDatabase) -> None:
        super().__init__(database)
        database.unsafe_skip_token_check = True


class StaleReleaseStore(MemoryStore):
    """Lets a release through with a stale token (a writer whose attempt was superseded)."""

    async def release(
        self, operation_id: str, token: int, evidence: Evidence, **options: Any
    ) -> Operation | None:
        current = self.db.rows.get(operation_id)
        if current is not None and current.state in (State.IN_FLIGHT, State.UNKNOWN):
            token = current.token
        return await super().release(operation_id, token, evidence, **options)


class ForgetfulLeaseStore(MemoryStore):
    """Drops the attempt's lease expiry once it ends (as the SQLite store once did), so a
    probe's grace counts from the claim and forgets every renewal."""

    def _forget(self, operation: Operation | None) -> Operation | None:
        if operation is None or operation.state is State.IN_FLIGHT:
            return operation
        bare = operation._replace(lease_expires_at=None)
        self.db.rows[bare.id] = bare
        return bare

    async def mark_unknown(
        self, operation_id: str, token: int, evidence: Evidence, events: Any = ()
    ) -> Operation | None:
        return self._forget(await super().mark_unknown(operation_id, token, evidence, events))

    async def expire_orphans(self, *, owner: str | None) -> int:
        count = await super().expire_orphans(owner=owner)
        for operation in list(self.db.rows.values()):
            if operation.state is State.UNKNOWN:
                self._forget(operation)
        return count


class EmptySweepStore(MemoryStore):
    """Sweeps an expired receipt to an empty body that still looks replayable."""

    async def sweep(self, *, batch: int) -> SweepReport:
        now = self.db.clock()
        for operation in list(self.db.rows.values()):
            response = operation.response
            expired = operation.expires_at is not None and operation.expires_at <= now
            if operation.state is State.COMPLETED and response is not None and expired:
                self.db.rows[operation.id] = operation._replace(
                    response=StoredResponse(response.status, (), b""), expires_at=None
                )
        return await super().sweep(batch=batch)


class LaggingReadStore(MemoryStore):
    """Reads by id return the record as it was before its last write (a lagging replica)."""

    async def get_by_id(self, operation_id: str) -> Operation | None:
        for transition in reversed(self.db.history):
            if transition.operation_id == operation_id and transition.before is not None:
                return transition.before
        return await super().get_by_id(operation_id)


class BindingBlindStore(MemoryStore):
    """Forgets the binding a refusal left on a key: once the twin completed, the same
    request under the refused key goes ahead (a second effect)."""

    def _bound_twin(self, request: ClaimRequest, guard: SimilarGuard, now: float) -> None:
        return None


def test_a_store_that_forgets_bindings_is_caught() -> None:
    """`twin-effect` holds the store to the binding too, not only to unsettled twins."""
    violation = hunt(BindingBlindStore, draw=Scenario.losing_keys)
    assert any(
        problem.invariant == "twin-effect" and "bound to" in problem.detail
        for problem in violation.problems
    ), str(violation)


QUIET = {"store_faults": 0.0, "crashes": False, "pauses": False, "upstream_trouble": 0.6}
"""Fewer unrelated faults, more slow and lost answers: long attempts that turn unknown."""


@pytest.mark.parametrize(
    ("store", "invariants", "focus"),
    [
        pytest.param(TokenBlindStore, None, {}, id="token-blind"),
        pytest.param(StaleReleaseStore, {"unknown-exit", "sent-released"}, {}, id="stale-release"),
        pytest.param(ForgetfulLeaseStore, {"sent-released"}, QUIET, id="grace-from-claim"),
        pytest.param(EmptySweepStore, {"receipt-provenance"}, {}, id="empty-sweep"),
        pytest.param(LaggingReadStore, None, {}, id="lagging-reads"),
    ],
)
def test_a_broken_store_is_caught(
    store: StoreFactory, invariants: set[str] | None, focus: dict[str, Any]
) -> None:
    """Each deliberately broken store makes some seed fail, on the invariant that guards it."""
    violation = hunt(store, **focus)
    broken = {problem.invariant for problem in violation.problems}
    if invariants is not None:
        assert broken & invariants, str(violation)


# -- the memory store's claim of the same request under a new key ------------------------------


def _claim(
    key: str, fingerprint: str = "fp-a", *, guarded: bool = True, **guard: Any
) -> ClaimRequest:
    return ClaimRequest(
        scope="alice",
        key=key,
        fingerprint=fingerprint,
        route="tickets",
        method="POST",
        path="/v1/issues",
        owner="gw-test",
        lease_seconds=5.0,
        tombstone_seconds=60.0,
        similar=SimilarGuard(**{"window": 900.0, **guard}) if guarded else None,
    )


def _events(db: MemoryDatabase, op_id: str) -> list[tuple[str, dict[str, Any]]]:
    return [(row.type, json.loads(row.data)) for row in db.events[op_id]]


def test_memory_store_refuses_the_same_request_under_a_new_key() -> None:
    """The store contract, on the simulation's store: an unsettled twin refuses a new
    key and binds it; the binding keeps refusing in the twin's name (even completed)
    within the window; a completed twin is only noted; a distinct request is claimed
    beside its twin, both histories naming the other; a derived key is never refused."""
    world = WorldClock()
    db = MemoryDatabase(world)
    store = MemoryStore(db)

    async def scenario() -> None:
        await store.open()
        first = await store.claim(_claim("k1"))
        assert isinstance(first, NewAttempt)
        assert first.twin is None
        twin = first.operation

        refused = await store.claim(_claim("k2"))
        assert isinstance(refused, Similar)
        assert refused.twin.id == twin.id
        assert db.current("alice", "k2") is None
        assert db.bindings[("alice", "k2")] == Binding("fp-a", twin.id, world.now, world.now + 900)
        assert db.history[-1].verb == "bind"
        assert db.history[-1].binding == ("alice", "k2")
        assert db.history[-1].before is None
        assert db.history[-1].after is None

        # Another request, or another route's or scope's twin, is not the same request.
        other = await store.claim(_claim("k3", fingerprint="fp-b"))
        assert isinstance(other, NewAttempt)
        assert other.twin is None
        unguarded = await store.claim(_claim("k4", guarded=False))
        assert isinstance(unguarded, NewAttempt)
        derived = await store.claim(_claim("k5", derived=True, refuse=()))
        assert isinstance(derived, NewAttempt)
        assert derived.twin is None
        for operation in (unguarded.operation, derived.operation):  # out of the way
            await store.release(
                operation.id,
                operation.token,
                Evidence(world.now, "test", "-"),
                tombstone_seconds=0.0,
            )

        world.advance(1.0)
        done = await store.complete(
            twin.id,
            twin.token,
            StoredResponse(201, (), b"{}"),
            body_retained=True,
            retention_seconds=60.0,
            tombstone_seconds=60.0,
            resolution=Resolution("upstream", world.now),
        )
        assert done is not None
        writes = len(db.history)
        again = await store.claim(_claim("k2"))  # bound: refused in the twin's name
        assert isinstance(again, Similar)
        assert again.twin.state is State.COMPLETED
        assert len(db.history) == writes, "a bound refusal writes nothing"
        noted = await store.claim(_claim("k6"))  # a completed twin is only noted
        assert isinstance(noted, NewAttempt)
        assert noted.twin is not None
        assert noted.twin.id == twin.id

        unsettled = await store.claim(_claim("k7", fingerprint="fp-c"))
        assert isinstance(unsettled, NewAttempt)
        version = unsettled.operation.version
        distinct = await store.claim(_claim("k8", fingerprint="fp-c", distinct=True))
        assert isinstance(distinct, NewAttempt)
        assert distinct.twin is not None
        assert distinct.twin.id == unsettled.operation.id
        assert _events(db, distinct.operation.id)[0][1]["distinct_from"] == distinct.twin.id
        kind, data = _events(db, unsettled.operation.id)[-1]
        assert (kind, data["operation"]) == ("distinct-twin", distinct.operation.id)
        assert db.rows[unsettled.operation.id].version == version

        world.advance(900.0)  # the binding and the twin's attempt are past the window...
        late = await store.claim(_claim("k9", vouched=False))  # ...unless not vouched for
        assert isinstance(late, Similar)
        assert late.twin.id == noted.operation.id
        fresh = await store.claim(_claim("k2"))
        assert isinstance(fresh, NewAttempt)
        world.advance(BINDING_SWEEP_SLACK)  # k2's binding is a day past its window, k9's not
        await store.sweep(batch=100)
        assert set(db.bindings) == {("alice", "k9")}
        assert db.history[-1].verb == "unbind"

    asyncio.run(scenario())
