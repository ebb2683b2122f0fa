"""The deterministic simulation (tests/simulation): a bounded run, replay, and proof it bites.

The long hunt is `make simulate` (10 minutes of seeds); here a short,
bounded run keeps every invariant in the normal suite, one seed is replayed
to show a failure can be reproduced exactly, and deliberately broken stores
and gateways show that each invariant catches the bug it claims to catch. A
broken gateway is built through the engine's own constructor seams (its
route, its `GraceClock`, the proxy's fingerprint setting), never by patching
a module.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from suite_profile import examples

from gateway.config import RouteSettings
from gateway.config.applies_to import AppliesTo
from gateway.engine.calibration import (
    CALIBRATION_TTL,
    Calibration,
    CalibrationChange,
    CalibrationState,
)
from gateway.engine.engine import IdempotencyEngine
from gateway.engine.graces import GraceClock
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
from tests.simulation.replica import GraceFactory
from tests.simulation.runner import run_seed
from tests.simulation.scenario import EMAILS_PATH, V2_ISSUES_PATH
from tests.simulation.simulator import RouteFactory, StoreFactory

KNOWN_ENGINE_BUGS = frozenset({"other-operation"})
"""Answer-state mismatch classes the simulation found in the engine and that are not
fixed yet; the bounded run counts them instead of failing. Remove a class once fixed.

`other-operation`: a request outlives its key's tombstone (its probe or a parked store
call returns after the record was forgotten and the key bound anew) and is answered
from the forgotten record: a conservative `unknown` or a 422, never a second effect.
It needs `tombstone_retention` shorter than one request's life (default 30 days)."""

RUN_SECONDS = 20.0
RUN_SEEDS = examples(800, fast=30)
"""`make test-full` runs seeds until 20 s are up (800 at most); `make test` the first 30
(about 19,000 steps, well past the 10,000 the test asks for), within the same 20 s."""
HUNT_SEEDS = 300
HUNT_SECONDS = 90.0
"""A hunt is bounded by its seeds; the time bound only stops one that hangs. At 10 s, a
loaded CI machine stopped the hunt for `claims-on-an-unsettled-clock` at seed 72 while
its first catching seed is 109 (4 s on a quiet machine): the seed count, not the clock,
decides what a hunt covers."""


def simulate(seed: int, **options: Any) -> Simulation:
    steps = options.pop("steps", None)
    return Simulation(Scenario.draw(seed, steps=steps), **options)


def hunt(
    store_factory: StoreFactory = MemoryStore,
    *,
    draw: Callable[..., Scenario] = Scenario.draw,
    engine_route: RouteFactory | None = None,
    graces: GraceFactory = GraceClock,
    **focus: Any,
) -> InvariantViolation:
    """Run seeds against a broken store or gateway until one fails (bounded in seeds and
    time).

    `focus` overrides the drawn scenario (fewer unrelated faults, or a fault class
    switched on) for bugs that need a rare interleaving; `draw` makes the scenarios
    (`Scenario.losing_keys`: agents that lose their keys); `engine_route` and `graces`
    break the gateway instead of the store (`Simulation`).
    """
    deadline = time.monotonic() + HUNT_SECONDS
    for seed in range(1, HUNT_SEEDS + 1):
        scenario = dataclasses.replace(draw(seed, steps=300), **focus)
        simulation = Simulation(
            scenario,
            store_factory=store_factory,
            engine_route=engine_route,
            graces=graces,
            tolerate=KNOWN_ENGINE_BUGS,
        )
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


LOST_KEY_SEEDS = examples(60, fast=15)
"""`make test-full`: up to 60 seeds within 10 s; `make test`: the first 15 (about 9,000
steps, every twin class the test counts met) within the same 10 s."""
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


EVERY_NEW_CLASS = {
    "other_path": EMAILS_PATH,
    "other_declared": True,
    "long_pauses": True,
    "clock_steps": 4.0,
    "reserialise": 0.7,
    "keeper_loop": True,
    "timeout": 5.0,
    "upstream_trouble": 0.6,
}
"""The third round's fault classes all at once: calibration probes about random unused
keys, timers the engine sets (a probe scheduled at a window's end), loops on simulated
time (the keeper's, the witness's): none may make a replay differ."""


@pytest.mark.parametrize(
    ("lost_keys", "focus"),
    [(False, {}), (True, {}), (True, EVERY_NEW_CLASS)],
    ids=["keys-kept", "keys-lost", "third-round"],
)
def test_a_seed_replays_identically(lost_keys: bool, focus: dict[str, Any]) -> None:
    """The same seed makes the same trace, step for step, every time it runs."""
    traces = []
    for _ in range(2):
        scenario = (Scenario.losing_keys if lost_keys else Scenario.draw)(7)
        scenario = dataclasses.replace(scenario, **focus)
        simulation = Simulation(scenario, keep_trace=True, tolerate=KNOWN_ENGINE_BUGS)
        report = asyncio.run(simulation.run())
        traces.append((simulation.full_trace, report.trace_digest))
    assert traces[0] == traces[1]
    assert traces[0][0] is not None
    assert len(traces[0][0]) > 200


STEPS_THAT_LAST = (268, 81, 266, 130, 369, 714, 2841, 2401)
"""Seeds whose store clock steps back for a stretch of world time (several readings:
`Scenario.clock_step_window`) each broke an invariant of an earlier engine: a second
claim taken in the same step and not itself a witness (268: `sent-released`), a
renewal read on the stepped clock that shortened a lease, a process started during a
step that saw none (2841), a process paused across two steps whose readings agreed
(2401). `python -m tests.simulation --seed 2401 --clock-step-window` replays one."""


@pytest.mark.parametrize("seed", STEPS_THAT_LAST)
def test_store_clock_steps_that_last_keep_every_invariant(seed: int) -> None:
    """Short backward steps of the store's clock that last a while, not one claim, keep
    every invariant: the clock is unsettled after a backward step and after a stretch
    nobody watched, and nothing is claimed on it until it is settled."""
    run_seed(seed, clock_step_window=True, tolerate=KNOWN_ENGINE_BUGS)


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
RENEWED_PAST_THE_CALL = {
    **QUIET,
    "keeper_loop": True,
    "timeout": 0.01,
    "lease": 3.0,
    "not_applied_after": 1.0,
    "scopes": ("alice",),
    "other_path": None,
    "long_pauses": False,
    "clock_steps": False,
}
"""`QUIET`, with keepers that renew on time and a whole-call limit next to nothing: every
renewal outlasts the call's limit, so the last lease expiry alone bounds an effect (since
windows count the whole call, a store that forgets renewals is wrong only for attempts
renewed past it); one scope and a probe that sees everything, so it is calibrated early."""


@pytest.mark.parametrize(
    ("store", "invariants", "focus"),
    [
        pytest.param(TokenBlindStore, None, {}, id="token-blind"),
        pytest.param(StaleReleaseStore, {"unknown-exit", "sent-released"}, {}, id="stale-release"),
        pytest.param(
            ForgetfulLeaseStore, {"sent-released"}, RENEWED_PAST_THE_CALL, id="grace-from-claim"
        ),
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


# -- deliberately broken gateways: a probe that proves it can see, windows, witnesses ----------


class CoversEverything(RouteSettings):
    """A gateway that releases on "not found" without checking `applies_to`: each entry
    covers any path of its length (every segment taken as `*`), so its probe is taken to
    see `/v2/issues` beside the `/v1/issues` it was declared for.

    The rule lives in `gateway.engine.calibrator.sight`, which reads the route it is
    given: the engine's route (its constructor seam) is this one, the world's is not.
    A store whose `resolve` ignored `calibrated` would not do: the calibrator refuses an
    undeclared kind before any store call, and a blind kind is never calibrated, so the
    releasing transaction's own check is only a race's last word (another replica
    marking the kind blind meanwhile)."""

    def applies_to(self) -> tuple[AppliesTo, ...]:
        return tuple(
            entry._replace(segments=("*",) * len(entry.segments)) for entry in super().applies_to()
        )


def without_applies_to(route: RouteSettings) -> RouteSettings:
    return CoversEverything.model_validate(route.model_dump())


class CalibrationSkippingStore(MemoryStore):
    """Treats every kind as calibrated: a calibration row that says so for each kind the
    route has, and a releasing transaction that admits every probe's release. Its probe
    declared for `/v1/emails`, which it cannot see, releases sent emails."""

    async def calibrations(self, route: str) -> tuple[Calibration, ...]:
        now = self.db.clock()
        kinds = await self.route_kinds(route, limit=64)
        state = CalibrationState.CALIBRATED
        return tuple(Calibration(route, kind, state, at=now, detail="skipped") for kind in kinds)

    def _admits_release(self, route: str, kind: str, now: float) -> bool:
        return True


def grace_from_the_last_lease(route: RouteSettings) -> RouteSettings:
    """A gateway whose release window counts the grace from the attempt's last lease
    expiry only, ignoring the whole-call limit (`Settler.release_window` takes the
    limit from the engine's route: here next to nothing; the world's upstream still
    works to the route's real `timeout`)."""
    return route.model_copy(update={"timeout": 1e-3})


class ClaimBlindGraces(GraceClock):
    """Clock witnesses that ignore the claims' readings (as before the third round: a step
    shorter than the periodic witness interval, during a claim, goes unseen; the claim
    keeps its times an hour off and is sent). Readings are told apart by who takes them:
    the engine's `_claim`."""

    def witness(self, store_now: float, *, before: float, after: float) -> None:
        caller = sys._getframe(1).f_code
        if caller is IdempotencyEngine._claim.__code__:
            return
        super().witness(store_now, before=before, after=after)


class UnsettledBlindGraces(GraceClock):
    """A clock never unsettled: a claim made right after a backward step (or after a
    stretch nobody watched) is sent on the stepped clock, its times an hour off, as long
    as its own reading agrees with the one before it."""

    def unsettled(self) -> bool:
        return False


def byte_fingerprints(seed: int, *, steps: int | None = None) -> Scenario:
    """Agents that lose their keys and re-serialise their requests, in front of a gateway
    whose fingerprints compare bytes (version 1, the proxy's `testing.canonical_json` off)."""
    return dataclasses.replace(
        Scenario.losing_keys(seed, steps=steps), reserialise=0.7, canonical_json=False
    )


BLIND_V2 = {"other_path": V2_ISSUES_PATH, "other_declared": False, **QUIET}
"""The probe cannot see `/v2/issues` (the first kind's path, not declared in `applies_to`)."""
BLIND_EMAILS = {"other_path": EMAILS_PATH, "other_declared": True, **QUIET}
"""The probe cannot see `/v1/emails`, though its `applies_to` declares it."""
LONG_PAUSES = {"long_pauses": True, "timeout": 10.0, **QUIET}
"""Replicas frozen past their lease with a call on the wire; a whole-call limit longer
than the lease and the grace."""
CLOCK_STEPS = {
    **QUIET,
    "clock_steps": 10.0,
    "timeout": 30.0,
    "store_latency": 0.0,
    "long_pauses": False,
    "other_path": None,
}
"""The store's clock steps back an hour during one claim, often (each step on its own,
once every replica's periodic witness has read the clock again: no pauses, no parked
calls to hold those up); an upstream slow to apply, and a long whole-call limit, so a
claim sent with times an hour off is still within its window, and often without its
effect, when another replica probes it."""
LASTING_STEPS = {**CLOCK_STEPS, "clock_step_window": True}
"""The store's clock steps back an hour for a stretch of world time, often, whatever
reads it meanwhile."""


@pytest.mark.parametrize(
    ("mutant", "invariants"),
    [
        pytest.param(
            {"engine_route": without_applies_to, **BLIND_V2},
            {"sent-released", "duplicate-effect"},
            id="releases-undeclared",
        ),
        pytest.param(
            {"store_factory": CalibrationSkippingStore, **BLIND_EMAILS},
            {"sent-released", "duplicate-effect"},
            id="skips-calibration",
        ),
        pytest.param(
            {"engine_route": grace_from_the_last_lease, **LONG_PAUSES},
            {"sent-released", "duplicate-effect"},
            id="grace-from-last-lease",
        ),
        pytest.param(
            {"graces": ClaimBlindGraces, **CLOCK_STEPS},
            {"sent-released", "duplicate-effect", "answer-state"},
            id="claims-not-witnessed",
        ),
        pytest.param(
            {"graces": UnsettledBlindGraces, **LASTING_STEPS},
            {"sent-released", "duplicate-effect", "answer-state"},
            id="claims-on-an-unsettled-clock",
        ),
        pytest.param(
            {"draw": byte_fingerprints},
            {"twin-effect"},
            id="byte-fingerprints",
        ),
    ],
)
def test_a_broken_gateway_is_caught(mutant: dict[str, Any], invariants: set[str]) -> None:
    """Each rule of the third round, broken on purpose, makes some seed fail on the
    invariant it protects: a release of an effect the probe cannot see (not declared, or
    declared but never calibrated), a release before the whole call's window closed (a
    replica frozen past its lease), a claim whose store clock was an hour off, and the
    same request re-serialised under a new key taken for another request. (A claim whose
    store clock was an hour off holds a lease already past: other replicas record it
    expired while its holder still answers `in_flight`, `answer-state`, before a probe
    releases it while its send may still land, `sent-released`.)"""
    violation = hunt(**mutant)
    broken = {problem.invariant for problem in violation.problems}
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


def test_memory_store_calibrates_and_takes_late_answers_as_sqlite_does() -> None:
    """The third round's verbs on the simulation's store (the SQL stores' semantics):
    calibration samples are the upstream's own 2xx completions of a kind (a swept body
    still counts, by its status), the releasing `resolve` obeys the kind's row as it
    reads it, and a late answer completes a release with no newer attempt, or fills an
    operator's `applied` that has no receipt, and nothing else."""
    world = WorldClock()
    db = MemoryDatabase(world)
    store = MemoryStore(db)
    kind = "POST /*/issues"
    ok = StoredResponse(201, (("content-type", "application/json"),), b'{"ok":1}')
    evidence = Evidence(world.now, "test", "-")

    async def settled(key: str) -> Operation:
        claimed = await store.claim(_claim(key, f"fp-{key}", guarded=False)._replace(kind=kind))
        assert isinstance(claimed, NewAttempt)
        operation = claimed.operation
        done = await store.complete(
            operation.id,
            operation.token,
            ok,
            body_retained=True,
            retention_seconds=5.0,
            tombstone_seconds=600.0,
            resolution=Resolution("upstream", world.now),
        )
        assert done is not None
        return done

    async def unknown(key: str) -> Operation:
        claimed = await store.claim(_claim(key, f"fp-{key}", guarded=False)._replace(kind=kind))
        assert isinstance(claimed, NewAttempt)
        marked = await store.mark_unknown(claimed.operation.id, claimed.operation.token, evidence)
        assert marked is not None
        return marked

    async def release_by_probe(operation: Operation) -> Operation | None:
        return await store.resolve(
            operation.id,
            token=operation.token,
            expected_version=None,
            state=State.RELEASED,
            response=None,
            resolution=Resolution("probe", world.now),
            retention_seconds=0.0,
            tombstone_seconds=600.0,
            calibrated=("tickets", kind),
        )

    async def scenario() -> None:
        await store.open()
        first = await settled("k1")
        world.advance(10.0)
        second = await settled("k2")
        samples = await store.calibration_samples(
            route="tickets", kind=kind, scope="alice", completed_since=None, limit=5
        )
        assert [op.id for op in samples] == [second.id, first.id]  # newest first
        recent = await store.calibration_samples(
            route="tickets", kind=kind, scope="alice", completed_since=world.now, limit=5
        )
        assert [op.id for op in recent] == [second.id]
        assert await store.route_kinds("tickets", limit=5) == (kind,)
        found = await store.latest_of_request(
            scope="alice", route="tickets", fingerprints=("fp-k9", "fp-k2")
        )
        assert found is not None
        assert found.id == second.id
        world.advance(6.0)
        await store.sweep(batch=10)  # both bodies dropped: still samples, by their status
        assert db.rows[first.id].response is None
        assert len(await store.calibration_samples(
            route="tickets", kind=kind, scope=None, completed_since=None, limit=5
        )) == 2  # fmt: skip

        # No row: a probe's release is refused in the transaction; calibrated: admitted.
        lost = await unknown("k3")
        assert await release_by_probe(lost) is None
        change = CalibrationChange(
            "tickets", kind, CalibrationState.CALIBRATED, "t", "ok", first.id
        )
        row = await store.save_calibration(change)
        assert row is not None
        assert (await store.calibrations("tickets")) == (row,)
        assert db.history[-1].verb == "calibrate"
        assert db.history[-1].calibration == row
        world.advance(CALIBRATION_TTL)  # an hour on: calibrate again first
        assert await release_by_probe(lost) is None
        blind = change._replace(state=CalibrationState.BLIND)
        assert (await store.save_calibration(blind)) is not None
        assert await release_by_probe(lost) is None
        await store.save_calibration(change)
        released = await release_by_probe(lost)
        assert released is not None
        assert released.state is State.RELEASED

        # A late answer of the released attempt completes it, as the upstream's.
        assert await store.complete_late(
            lost.id, 2, ok, body_retained=True, retention_seconds=60.0, tombstone_seconds=60.0
        ) is None  # fmt: skip
        late = await store.complete_late(
            lost.id, 1, ok, body_retained=True, retention_seconds=60.0, tombstone_seconds=60.0
        )
        assert late is not None
        assert (late.state, late.response, late.token) == (State.COMPLETED, ok, released.token + 1)
        assert late.resolution is not None
        assert late.resolution.by == "upstream"

        # An operator's `applied` without a receipt gains one; with a receipt, nothing.
        for key, response in (("k4", None), ("k5", ok)):
            pending = await unknown(key)
            applied = await store.resolve(
                pending.id,
                token=pending.token,
                expected_version=None,
                state=State.COMPLETED,
                response=response,
                resolution=Resolution("admin", world.now, "checked"),
                retention_seconds=60.0,
                tombstone_seconds=60.0,
            )
            assert applied is not None
            filled = await store.complete_late(
                pending.id,
                1,
                ok,
                body_retained=True,
                retention_seconds=60.0,
                tombstone_seconds=60.0,
            )
            if response is None:
                assert filled is not None
                assert filled.response == ok
                assert filled.resolution == applied.resolution
            else:
                assert filled is None

    asyncio.run(scenario())
