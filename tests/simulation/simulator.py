"""The deterministic simulator: one seed decides every step, every fault, every interleaving.

Replicas (production `IdempotencyEngine`s, see `tests.simulation.replica`)
share one in-memory database and one scripted upstream. Each step the seed's
random generator picks one action (a request, a lookup, an operator's
resolve, a keeper round, a sweep, time passing, a clock step or pause, a
replica frozen past its lease with a call on the wire, a short backward step
of the store's clock, a store fault, a crash or a restart, or the upstream
deciding the fate of a send or a probe), the simulator runs the event loop
until it is quiescent (every live task waits on something only the simulator
can release), and then checks every invariant (`tests.simulation.invariants`).

Determinism: no real time, no real I/O, no threads; ids come from a counter
(a calibration's "forwarded key never used" is random, and never written to
the trace); every choice comes from `random.Random(seed)` in an order fixed
by the single-threaded event loop, whose own clock is world time during a run
(a timer the engine sets fires when world time reaches it). Python's string
hashing is randomized per process, so the runner (`python -m tests.simulation`)
pins `PYTHONHASHSEED` for seeds to replay across processes (engine code
iterates a set of keys).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from gateway.config import RouteSettings
from gateway.engine.exchange import ProxyRequest
from gateway.engine.fingerprint import canonical_path, fingerprints
from gateway.engine.graces import UNWATCHED_GAP, WITNESS_INTERVAL, GraceClock
from gateway.engine.models import State, StoredResponse
from gateway.engine.sweeper import Sweeper
from tests.simulation.calls import EngineCalls, Intent
from tests.simulation.clock import StoreClock, WorldClock
from tests.simulation.context import annotate
from tests.simulation.faults import FaultKind
from tests.simulation.invariants import Invariants, Problem
from tests.simulation.memory_store import MemoryDatabase, MemoryStore
from tests.simulation.replica import GraceFactory, Replica
from tests.simulation.scenario import (
    OTHER_SHARE,
    REQUEST_PATH,
    STORE_STEP,
    UPSTREAM,
    Scenario,
)
from tests.simulation.upstream import ScriptedUpstream, SendCall

__all__ = ["InvariantViolation", "RunReport", "Simulation", "StoreFactory"]

StoreFactory = Callable[[MemoryDatabase], MemoryStore]
RouteFactory = Callable[[RouteSettings], RouteSettings]
Action = Callable[[], str]

QUERY = "notify=1&team=ops"
"""The query of every request in a seed whose agents re-serialise (`Scenario.reserialise`)."""
RESERIALISATIONS = ("order", "space", "float", "escape", "charset", "query", "percent")
"""How an agent may write the same JSON request again (see `Simulation._reserialise`)."""
REFUSED_BY_PROBE = frozenset({"not-declared", "probe-blind", "not-calibrated", "too-many-kinds"})
"""Probe verdicts that leave an operation to a person (`gateway.engine.calibrator`): the
drain settles these by hand, as the evidence tells an operator to."""

TRACE_TAIL = 60
"""Steps of trace printed with a failure."""

FAULT_VERBS = (
    None,
    "claim",
    "complete",
    "mark_unknown",
    "release",
    "resolve",
    "renew",
    "add_evidence",
    "get",
    "get_by_id",
    "expire_orphans",
    "list_operations",
    "complete_late",
    "calibrations",
    "calibration_samples",
    "save_calibration",
)


class InvariantViolation(AssertionError):
    """An invariant broke: the seed, the step, what broke, and the trace that led there."""

    def __init__(
        self, seed: int, step: int, problems: list[Problem], trace: list[str], *, flags: str = ""
    ) -> None:
        self.seed, self.step, self.problems, self.trace = seed, step, problems, trace
        lines = [
            f"seed {seed}: invariant violated at step {step}",
            *(f"  {problem}" for problem in problems),
            f"replay: python -m tests.simulation --seed {seed}{flags}",
            f"last {len(trace)} trace lines:",
            *(f"  {line}" for line in trace),
        ]
        super().__init__("\n".join(lines))


@dataclass(slots=True)
class RunReport:
    """What one seed did."""

    seed: int
    scenario: Scenario
    steps: int = 0
    actions: Counter[str] = field(default_factory=Counter)
    sends: int = 0
    effects: int = 0
    probes: int = 0
    final_states: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    excused: Counter[str] = field(default_factory=Counter)
    twins: Counter[str] = field(default_factory=Counter)
    """What the similar-operation guard met (`Invariants.twins`)."""
    transitions: Counter[str] = field(default_factory=Counter)
    """Committed writes by kind ("resolve unknown->released by probe"): what the run covered."""
    trace_digest: str = ""
    seconds: float = 0.0


class _Metrics:
    """The sweeper's metrics sink; the simulation counts nothing there."""

    def lease_expired(self, count: int) -> None:
        pass

    def swept_records(self, receipts: int, forgotten: int) -> None:
        pass


class Simulation:
    """One seed's world: `await Simulation(Scenario.draw(seed)).run()`, or `InvariantViolation`.

    `store_factory` is a test-only hook to put a deliberately broken store in
    front of the database and prove the invariants notice; `engine_route` (the
    route as the gateway is configured, when a test breaks it on purpose: the
    world keeps the scenario's) and `graces` (each replica's `GraceClock`) are
    the same for a broken gateway, through the engine's own constructor seams.
    `tolerate` names classes of answer-state mismatch (see
    `invariants._mismatch_class`) to count instead of fail: known engine bugs,
    so a hunt can look past them.
    `echo` receives every trace line as it is written; `keep_trace` keeps them
    all in `full_trace` (the replay test compares two runs' traces).
    """

    def __init__(
        self,
        scenario: Scenario,
        *,
        store_factory: StoreFactory = MemoryStore,
        engine_route: RouteFactory | None = None,
        graces: GraceFactory = GraceClock,
        echo: Callable[[str], None] | None = None,
        keep_trace: bool = False,
        tolerate: frozenset[str] = frozenset(),
    ) -> None:
        self.scenario = scenario
        self.rng = random.Random(scenario.seed)
        self.world = WorldClock()
        self.store_clock = StoreClock(self.world)
        self.db = MemoryDatabase(self.store_clock, true_time=self.world)
        self.db.annotate = annotate
        self._store_factory = store_factory
        self.route = scenario.route()
        self._engine_route = self.route if engine_route is None else engine_route(self.route)
        self._graces = graces
        self.settings = scenario.idempotency()
        self.upstream = ScriptedUpstream(
            self.world,
            self.db,
            not_applied_after=scenario.not_applied_after,
            whole_call=scenario.timeout,
            large_body=400,
            blind=frozenset(canonical_path(path) for path in scenario.blind_paths()),
        )
        self.operator_responses: dict[str, list[StoredResponse]] = {}
        self.invariants = Invariants(
            self.db, self.upstream, self.route, self.operator_responses, tolerate=tolerate
        )
        self.calls = EngineCalls(
            db=self.db,
            world=self.world,
            upstream=self.upstream,
            invariants=self.invariants,
            operator_responses=self.operator_responses,
            note=self._note,
        )
        self.replicas: list[Replica] = []
        self._loops = 2 if scenario.keeper_loop else 1
        """Tasks a replica always runs (its witness loop, and its keeper's if on)."""
        self._frozen: dict[str, float] = {}
        """Replicas frozen with a call on the wire -> the world time they may wake from."""
        self._dead_owners: list[str] = []
        self._parked_store: list[tuple[str, asyncio.Future[None]]] = []
        self._latency = scenario.store_latency
        self._trace: deque[str] = deque(maxlen=TRACE_TAIL)
        self._digest = hashlib.sha256()
        self._echo = echo
        self.full_trace: list[str] | None = [] if keep_trace else None
        self._step = 0
        self._labels = 0
        self._intent_keys: dict[str, list[Intent]] = {}
        """Each intended call's keys so far (the first, then every fresh one)."""
        self._fresh_keys = 0
        self.report = RunReport(seed=scenario.seed, scenario=scenario)

    # -- tracing ---------------------------------------------------------------------------

    def _note(self, line: str) -> None:
        text = f"{self._step:4d} +{self.world.elapsed:8.3f} {line}"
        self._trace.append(text)
        self._digest.update(text.encode() + b"\n")
        if self.full_trace is not None:
            self.full_trace.append(text)
        if self._echo is not None:
            self._echo(text)

    def _label(self, replica: Replica, what: str) -> str:
        self._labels += 1
        return f"{replica.name}:{what}#{self._labels}"

    # -- the run ---------------------------------------------------------------------------

    async def run(self) -> RunReport:
        """Run the seed on the running event loop, whose clock is world time meanwhile."""
        loop = asyncio.get_running_loop()
        # The loop's clock, for this run only: world time, so a timer the engine sets
        # (a probe scheduled at a release window's end, `asyncio.timeout`) fires when
        # simulated time reaches it, the same in every replay, and never by the host's.
        loop.time = self.world.loop_time  # type: ignore[method-assign]
        try:
            return await self._run()
        finally:
            await self._stop_everything()
            del loop.time  # back to the class's own

    async def _stop_everything(self) -> None:
        """Cancel what is left (a violation stops the run mid-flight) without parking anew."""
        for replica in self.replicas:
            replica.clock.resume()
            for task in replica.tasks:
                task.cancel()
        for _ in range(3):
            await asyncio.sleep(0)

    async def _run(self) -> RunReport:
        started = time.perf_counter()
        self._note(f"seed {self.scenario.seed}: {self.scenario.describe()}")
        for _ in range(self.scenario.replicas):
            self._join()
        await self._settle()
        for step in range(1, self.scenario.steps + 1):
            self._step = step
            name, action = self._choose()
            self.report.actions[name] += 1
            self._note(action())
            await self._settle()
            self._check()
        self._step += 1
        await self._drain()
        self.report.steps = self.scenario.steps
        self.report.sends = len(self.upstream.sends)
        self.report.effects = sum(len(e) for e in self.upstream.effects.values())
        self.report.probes = len(self.upstream.probes)
        self.report.final_states = Counter(op.state.value for op in self.db.rows.values())
        self.report.excused = self.invariants.excused
        self.report.twins = self.invariants.twins
        for t in self.db.history:
            if t.binding is not None:  # a key's binding, no operation row
                self.report.transitions[f"{t.verb} (similar-operation binding)"] += 1
                continue
            if t.calibration is not None:  # a probe calibration row
                calibrated = f"{t.calibration.kind} {t.calibration.state.value}"
                self.report.transitions[f"calibrate {calibrated} by {t.calibration.actor}"] += 1
                continue
            before = t.before.state.value if t.before is not None else "new"
            after = t.after.state.value if t.after is not None else "gone"
            by = (
                t.after.resolution.by
                if t.verb == "resolve" and t.after and t.after.resolution
                else ""
            )
            self.report.transitions[f"{t.verb} {before}->{after}{f' by {by}' if by else ''}"] += 1
        for replica in self.replicas:
            for kind, verb in replica.store.fired:
                self.report.faults[f"{kind}:{verb}"] += 1
        self.report.trace_digest = self._digest.hexdigest()[:16]
        self.report.seconds = time.perf_counter() - started
        return self.report

    def _check(self) -> None:
        problems = self.invariants.after_step()
        if problems:
            raise self._violation(problems)

    def _violation(self, problems: list[Problem]) -> InvariantViolation:
        flags = " --lost-keys" if self.scenario.lost_keys else ""
        if self.scenario.similar_guard != "unsettled":
            flags += f" --similar-guard {self.scenario.similar_guard}"
        if not self.scenario.canonical_json:
            flags += " --byte-fingerprints"
        if self.scenario.clock_step_window:
            flags += " --clock-step-window"
        return InvariantViolation(
            self.scenario.seed, self._step, problems, list(self._trace), flags=flags
        )

    async def _settle(self) -> None:
        """Run the loop until every task waits on the simulator (or is done)."""
        loop = asyncio.get_running_loop()
        for _ in range(100_000):
            await asyncio.sleep(0)
            # CPython's ready queue (there is no public "idle" test): empty right
            # after our own wake-up means nothing else can run until we act.
            if not loop._ready:  # type: ignore[attr-defined]
                break
        else:
            raise RuntimeError("the event loop never became quiescent")
        for replica in self.replicas:
            for task in replica.tasks:
                if task.done() and not task.cancelled() and task.exception() is not None:
                    self.invariants.crashed(task.get_name(), task.exception())  # type: ignore[arg-type]
            replica.reap()

    # -- choosing ---------------------------------------------------------------------------

    def _live(self) -> list[Replica]:
        return [r for r in self.replicas if r.alive]

    def _choose(self) -> tuple[str, Action]:
        s = self.scenario
        live = self._live()
        options: list[tuple[str, float, Action]] = []
        if live:
            options += [
                ("request", 20, self._act_request),
                ("lookup", 4, self._act_lookup),
                ("operator", 3, self._act_operator),
                ("reconcile", 3, self._act_reconcile),
                ("sweeper", 2, self._act_sweeper),
                ("upkeep", 8, self._act_upkeep),
            ]
            if s.skew or s.pauses:
                options.append(("clock", 3, self._act_clock))
            if self._wakeable():
                options.append(("resume", 4, self._act_resume))
            if s.long_pauses and self._freezable():
                options.append(("freeze", 3, self._act_freeze))
            if s.clock_steps and self._clock_steady():
                options.append(("store-clock", s.clock_steps, self._act_store_clock))
            if s.store_faults:
                options.append(("store-fault", 100 * s.store_faults, self._act_store_fault))
            if s.crashes:
                options.append(("crash", 0.6, self._act_crash))
        if len(live) < s.replicas:
            options.append(("join", 3 if live else 50, self._act_join))
        options.append(("advance", 12, self._act_advance))
        if self.upstream.pending_at_door():
            options.append(("door", 12, self._act_door))
        if self.upstream.effect_pending():
            options.append(("effect", 3, self._act_effect))
        if self.upstream.reply_pending():
            options.append(("reply", 10, self._act_reply))
        if self.upstream.pending_probes():
            options.append(("probe", 8, self._act_probe))
        if self._pending_store():
            options.append(("store-release", 12, self._act_store_release))
        names = [o[0] for o in options]
        weights = [o[1] for o in options]
        index = self.rng.choices(range(len(options)), weights=weights)[0]
        return names[index], options[index][2]

    def _pick(self, items: list[Any]) -> Any:
        return items[self.rng.randrange(len(items))]

    # -- replicas ---------------------------------------------------------------------------

    def _join(self) -> str:
        number = len(self.replicas) + 1
        skew = self.rng.uniform(-self.scenario.skew, self.scenario.skew)
        replica = Replica(
            f"r{number}",
            generation=number,
            world=self.world,
            store=self._store_factory(self.db),
            upstream=self.upstream,
            settings=self.settings,
            route=self._engine_route,
            skew=skew,
            graces=self._graces,
        )
        replica.store.hold = self._hold
        self.replicas.append(replica)
        replica.start("open", replica.store.open)
        replica.start("witness", replica.keep_witnessing)
        if self.scenario.keeper_loop:
            replica.start("keeper", replica.keep_leases)
        orphans = list(self._dead_owners)
        self._dead_owners.clear()
        for owner in orphans:
            label = self._label(replica, f"expire({owner})")
            self._background(replica, label, partial(replica.store.expire_orphans, owner=owner))
        restarts = f", expiring orphans of {', '.join(orphans)}" if orphans else ""
        return f"join {replica.name} ({replica.owner}, skew {skew:+.2f}){restarts}"

    def _act_join(self) -> str:
        return self._join()

    def _act_crash(self) -> str:
        replica = self._pick(self._live())
        replica.crash()
        self._frozen.pop(replica.name, None)
        self._dead_owners.append(replica.owner)
        return f"crash {replica.name} ({len(replica.tasks)} tasks cancelled)"

    # -- engine calls -------------------------------------------------------------------------

    def _request_for(self) -> tuple[ProxyRequest, Intent, str]:
        """The agent's next call: which request, under which of its keys, in which bytes.

        A request is an agent's intended call (scope, path, key name, body); once sent,
        each further request of it is a retry. An agent that loses its keys
        (`Scenario.lost_keys`) sends that fraction of its retries under a fresh key,
        marked distinct or not, and the others under one of the keys it used for the
        call before (a refused fresh key too): same request, so same fingerprint. Calls
        to the seed's second path (`Scenario.other_path`) use keys of their own (`e0`,
        ...). An agent that re-serialises (`Scenario.reserialise`) sends some requests in
        other bytes; the fingerprint is computed by the production functions from the
        bytes sent, as the proxy does. Also returns how the bytes were re-serialised.
        """
        s = self.scenario
        scope = self._pick(list(s.scopes))
        other = s.other_path is not None and self.rng.random() < OTHER_SHARE
        path = s.other_path if other and s.other_path is not None else REQUEST_PATH
        key = f"{'e' if other else 'k'}{self.rng.randrange(s.keys)}"
        variant = 2 if self.rng.random() < 0.08 else 1
        body = f'{{"key":"{key}","v":{variant}}}'.encode()
        intent = Intent(f"{scope}/{key}/v{variant}", key)
        if s.lost_keys:
            intent = self._agent_key(intent)
        query, content_type, how = (QUERY if s.reserialise else ""), "application/json", ""
        if s.reserialise and self.rng.random() < s.reserialise:
            body, query, content_type, path, how = self._reserialise(key, variant, path)
        fingerprint, legacy = fingerprints(
            "POST", self.route.name, path, query, content_type, body, s.canonical_json
        )
        request = ProxyRequest(
            route=self._engine_route,
            upstream_url=UPSTREAM + path + (f"?{query}" if query else ""),
            method="POST",
            path=path,
            headers=(("content-type", content_type),),
            body=body,
            scope=scope,
            key=intent.key,
            fingerprint=fingerprint,
            legacy_fingerprint=legacy,
            distinct=intent.distinct,
        )
        return request, intent, how

    def _reserialise(self, key: str, variant: int, path: str) -> tuple[bytes, str, str, str, str]:
        """The same JSON request in other bytes, as a language model writes its arguments
        again: (body, query, content type, path, which `RESERIALISATIONS` were used).
        Every one keeps the meaning; the version-2 fingerprint must see through them all."""
        chosen = [name for name in RESERIALISATIONS if self.rng.random() < 0.4]
        if not chosen:
            chosen = [self._pick(list(RESERIALISATIONS))]
        name = f"\\u{ord(key[0]):04x}{key[1:]}" if "escape" in chosen else key
        members = [f'"key":"{name}"', f'"v":{variant}.0' if "float" in chosen else f'"v":{variant}']
        if "order" in chosen:
            members.reverse()
        text = "{" + ",".join(members) + "}"
        if "space" in chosen:
            text = "{ " + ", ".join(m.replace(":", " : ", 1) for m in members) + " }\n"
        query = "team=ops&notify=1" if "query" in chosen else QUERY
        if "percent" in chosen:  # an unreserved character escaped, in the last segment too
            query = query.replace("team=ops", "team=%6Fps")
            head, _, last = path.rpartition("/")
            path = f"{head}/%{ord(last[0]):02X}{last[1:]}"
        charset = "; charset=utf-8" if "charset" in chosen else ""
        return text.encode(), query, f"application/json{charset}", path, ",".join(chosen)

    def _agent_key(self, intent: Intent) -> Intent:
        keys = self._intent_keys.get(intent.name)
        if keys is None:  # the call's first request
            self._intent_keys[intent.name] = [intent]
            return intent
        if self.rng.random() < self.scenario.lost_keys:
            self._fresh_keys += 1
            distinct = self.rng.random() < self.scenario.distinct
            fresh = Intent(intent.name, f"{intent.key}-lost{self._fresh_keys}", distinct, True)
            keys.append(fresh)
            return fresh
        return replace(self._pick(keys), fresh=False)  # type: ignore[no-any-return]

    def _act_request(self) -> str:
        replica = self._pick(self._live())
        request, intent, how = self._request_for()
        via_receipt = self.rng.random() < 0.3
        label = self._label(replica, f"req {request.scope}/{request.key}")
        replica.start(
            label, partial(self.calls.request, replica, label, request, via_receipt, intent=intent)
        )
        variant = " (other body)" if intent.name.endswith("/v2") else ""
        lost = f" (lost key of {intent.name})" if intent.fresh else ""
        distinct = " distinct" if intent.distinct else ""
        other = f" to {request.path}" if not request.path.endswith("/v1/issues") else ""
        again = f" (re-serialised: {how})" if how else ""
        receipt = " via receipt" if via_receipt else ""
        return f"start {label}{other}{variant}{lost}{distinct}{again}{receipt}"

    def _pick_key(self) -> tuple[str, str]:
        known = list(self.db.by_key)
        if known and self.rng.random() < 0.8:
            return self._pick(known)  # type: ignore[no-any-return]
        return self._pick(list(self.scenario.scopes)), f"k{self.rng.randrange(self.scenario.keys)}"

    def _act_lookup(self) -> str:
        replica = self._pick(self._live())
        scope, key = self._pick_key()
        label = self._label(replica, f"lookup {scope}/{key}")
        replica.start(label, partial(self.calls.lookup, replica, label, scope, key))
        return f"start {label}"

    def _act_operator(self) -> str:
        replica = self._pick(self._live())
        scope, key = self._pick_key()
        by = self._pick(["owner", "admin"])
        with_version = self.rng.random() < 0.5
        with_response = self.rng.random() < 0.7
        insist = self.rng.random() < 0.1
        label = self._label(replica, f"operator({by}) {scope}/{key}")
        replica.start(
            label,
            partial(
                self.calls.operator,
                replica,
                label,
                scope,
                key,
                by,
                with_version=with_version,
                with_response=with_response,
                insist=insist,
            ),
        )
        return f"start {label}"

    def _act_reconcile(self) -> str:
        replica = self._pick(self._live())
        label = self._label(replica, "reconcile")
        self._background(replica, label, replica.engine.reconcile_unknown)
        return f"start {label}"

    def _act_sweeper(self) -> str:
        replica = self._pick(self._live())
        label = self._label(replica, "sweeper")
        sweeper = Sweeper(replica.store, replica.engine, _Metrics(), interval=60.0)
        self._background(replica, label, sweeper.run_once)
        return f"start {label}"

    def _act_upkeep(self) -> str:
        replica = self._pick(self._live())
        label = self._label(replica, "upkeep")
        self._background(replica, label, replica.keeper.upkeep)
        return f"start {label} (debts {replica.keeper.debts})"

    def _background(self, replica: Replica, label: str, call: Callable[[], Awaitable[Any]]) -> None:
        replica.start(label, partial(self.calls.quietly, label, call))

    # -- time and clocks ------------------------------------------------------------------

    def _act_advance(self) -> str:
        roll = self.rng.random()
        if roll < 0.6:
            seconds = self.rng.uniform(0.01, 0.5)
        elif roll < 0.9:
            seconds = self.rng.uniform(0.5, 2.5)
        else:
            seconds = self.rng.uniform(2.5, 12.0)
        self._advance(seconds)
        return f"advance {seconds:.3f}s"

    def _advance(self, seconds: float) -> None:
        """World time moves on; an effect still pending must happen before its bound or never."""
        target = self.world.now + seconds
        for send in self.upstream.effect_pending():
            if self.upstream.bound(send.operation_id, send.attempt) <= target:
                if self.rng.random() < 0.5 and self.upstream.apply(send) is not None:
                    self._note(f"  late effect of {send.label} before its bound")
                else:
                    self.upstream.never(send)
        self.world.advance(seconds)

    def _act_clock(self) -> str:
        replica = self._pick(self._live())
        roll = self.rng.random()
        limit = max(self.scenario.skew, 1.0)
        if self.scenario.pauses and roll < 0.35 and not replica.clock.paused:
            replica.clock.pause()
            return f"pause {replica.name}"
        if roll < 0.7:
            seconds = self.rng.uniform(-limit, limit)
            replica.clock.step(seconds)
            return f"step {replica.name} clock {seconds:+.2f}s (skew {replica.clock.skew:+.2f})"
        skew = self.rng.uniform(-limit, limit)
        replica.clock.set_skew(skew)
        return f"skew {replica.name} clock to {skew:+.2f}s"

    def _wakeable(self) -> list[Replica]:
        """Paused replicas that may be resumed now (a frozen one once its time is up)."""
        now = self.world.now
        return [r for r in self._live() if r.clock.paused and now >= self._frozen.get(r.name, now)]

    def _act_resume(self) -> str:
        replica = self._pick(self._wakeable())
        paused_for = self.world.now - (replica.clock.paused_at or self.world.now)
        replica.clock.resume()
        frozen = " (frozen past its lease)" if self._frozen.pop(replica.name, None) else ""
        return f"resume {replica.name} after {paused_for:.2f}s{frozen}"

    def _freezable(self) -> list[Replica]:
        """Running replicas with a call on the wire (sent, its answer not yet delivered)."""
        on_wire = {s.replica for s in self.upstream.sends if s.departed and not s.future.done()}
        return [r for r in self._live() if not r.clock.paused and r.name in on_wire]

    def _act_freeze(self) -> str:
        """A process pause longer than a lease (a VM paused, SIGSTOP) while its call is on
        the wire: its lease lapses, others may find the record expired and probe it, and
        when it wakes it reads the answer late. It must settle the operation (or stay
        evidence), never make a second effect."""
        replica = self._pick(self._freezable())
        lasting = self.scenario.lease * self.rng.uniform(1.2, 4.0)
        replica.clock.pause()
        self._frozen[replica.name] = self.world.now + lasting
        return f"freeze {replica.name} with a call on the wire, for at least {lasting:.2f}s"

    def _clock_steady(self) -> bool:
        """Whether the store's clock may step again: each step short and on its own, as
        `gateway.engine.graces` assumes of them (its periodic witness is what sees a
        step's end): a witness interval since the last one ended, and a periodic witness
        of every live replica since then. Steps that last a while, several readings
        (`Scenario.clock_step_window`), are held only to what the engine assumes of any
        step: none within `UNWATCHED_GAP` of the last one's end, so two readings closer
        than that cannot both be on stepped clocks; a replica paused for longer checks
        its reading against the others' witnesses when it wakes."""
        clock = self.store_clock
        if self.scenario.clock_step_window:
            return clock.steady_for() >= UNWATCHED_GAP
        if clock.steady_for() < WITNESS_INTERVAL:
            return False
        return all(r.witnessed_at > clock.ended_at for r in self._live())

    def _act_store_clock(self) -> str:
        """The store's clock steps back an hour for less than a periodic witness interval,
        then comes back: only the readings taken meanwhile see it. During the next claim
        (whichever replica makes it), or for a stretch of world time
        (`Scenario.clock_step_window`)."""
        if not self.scenario.clock_step_window:
            self.store_clock.step_during("claim", STORE_STEP)
            return f"store clock steps {STORE_STEP:+.0f}s during the next claim"
        lasting = self.rng.uniform(0.05, 0.95 * WITNESS_INTERVAL)
        self.store_clock.step(STORE_STEP, lasting=lasting)
        return f"store clock steps {STORE_STEP:+.0f}s for {lasting:.2f}s"

    # -- store faults and latency ----------------------------------------------------------

    def _act_store_fault(self) -> str:
        replica = self._pick(self._live())
        store = replica.store
        roll = self.rng.random()
        if store.down and roll < 0.6:
            store.down = False
            return f"store reachable again from {replica.name}"
        if roll < 0.05:
            for other in self._live():
                other.store.down = True
            return "store down for every replica"
        if roll < 0.15:
            store.down = True
            return f"store unreachable from {replica.name}"
        kind: FaultKind = "lost" if self.rng.random() < 0.5 else "ambiguous"
        verb = self._pick(list(FAULT_VERBS))
        store.arm(kind, verb)
        return f"arm {kind} commit on {replica.name} for {verb or 'any call'}"

    def _hold(self, replica: str, verb: str) -> asyncio.Future[None] | None:
        """FaultyStore's latency hook: park this call until a store-release step."""
        if self._latency <= 0 or self.rng.random() >= self._latency:
            return None
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._parked_store.append((f"{replica}:{verb}", future))
        return future

    def _pending_store(self) -> list[tuple[str, asyncio.Future[None]]]:
        self._parked_store = [(n, f) for n, f in self._parked_store if not f.done()]
        return self._parked_store

    def _act_store_release(self) -> str:
        parked = self._pending_store()
        index = 0 if self.rng.random() < 0.5 else self.rng.randrange(len(parked))
        name, future = parked.pop(index)
        future.set_result(None)
        return f"store call {name} goes through"

    # -- the upstream's decisions -------------------------------------------------------------

    def _act_door(self) -> str:
        send: SendCall = self._pick(self.upstream.pending_at_door())
        trouble = self.scenario.upstream_trouble
        if self.rng.random() < 0.3 * trouble:
            self.upstream.refuse(send)
            return f"upstream refuses the connection of {send.label}"
        self.upstream.let_in(send)
        if send.effect == "never":
            return f"upstream receives {send.label} past its bound: it will not apply"
        if self.rng.random() >= trouble:
            effect = self.upstream.apply(send)
            self._answer(send)
            return f"upstream receives {send.label}, applies E{effect.number if effect else '?'}"
        return f"upstream receives {send.label}"

    def _act_effect(self) -> str:
        send: SendCall = self._pick(self.upstream.effect_pending())
        if self.rng.random() < 0.6:
            effect = self.upstream.apply(send)
            if effect is not None:
                return f"upstream applies {send.label} late: E{effect.number}"
            return f"upstream cannot apply {send.label} any more (past its bound)"
        self.upstream.never(send)
        return f"upstream will never apply {send.label}"

    def _act_reply(self) -> str:
        send: SendCall = self._pick(self.upstream.reply_pending())
        roll = self.rng.random()
        if roll < 0.15:
            self.upstream.drop(send, timeout=False)
            return f"upstream drops the connection of {send.label} (effect {send.effect})"
        if roll < 0.3:
            self.upstream.drop(send, timeout=True)
            return f"{send.label} times out (effect {send.effect})"
        if send.effect == "pending" and self.rng.random() < 0.7:
            self.upstream.apply(send)
        return self._answer(send)

    def _answer(self, send: SendCall) -> str:
        if send.effect == "applied":
            status = 201
        else:
            self.upstream.never(send)
            status = self._pick([429, 429, 500])
        large = status == 201 and self.rng.random() < 0.12
        cut = self.rng.random() < 0.08 * self.scenario.upstream_trouble
        cookie = self.rng.random() < 0.2
        self.upstream.answer(send, status=status, large=large, cut=cut, cookie=cookie)
        extra = "".join(
            f" {word}" for word, on in (("large", large), ("cut", cut), ("cookie", cookie)) if on
        )
        return f"upstream answers {send.label}: {status}{extra}"

    def _act_probe(self) -> str:
        probe = self._pick(self.upstream.pending_probes())
        roll = self.rng.random()
        if roll < 0.15:
            self.upstream.fail_probe(probe, unreachable=self.rng.random() < 0.5)
            return f"probe {probe.label} fails"
        self.upstream.answer_probe(probe, inconclusive=roll < 0.2)
        return f"probe {probe.label} answered {probe.status} ({probe.effects_seen} effects)"

    # -- the end: let everything finish, then check nothing is left hanging ----------------------

    async def _drain(self) -> None:
        """Heal the world, let every parked call finish honestly, then settle every unknown.

        After this, with the store reachable, clocks running and probes
        answering truthfully, no record may stay `in_flight` or `unknown`.
        """
        self._note("drain: heal everything, answer everything")
        self._latency = 0.0
        self._frozen.clear()
        self.store_clock.heal()
        for replica in self._live():
            replica.clock.resume()
            replica.store.down = False
            replica.store.armed.clear()
        if not self._live():
            self._join()
        for _ in range(60):
            progressed = self._drain_round()
            await self._settle()
            self._check()
            if not progressed:
                break
        s = self.scenario
        bound = s.lease + s.timeout + s.not_applied_after + 1.0
        for seconds in (bound, 1.0, 310.0, 310.0, 310.0):
            self._advance(seconds)
            for replica in self._live():
                label = self._label(replica, "drain sweeper")
                sweeper = Sweeper(replica.store, replica.engine, _Metrics(), interval=60.0)
                self._background(replica, label, sweeper.run_once)
                break
            for _ in range(60):
                await self._settle()
                self._check()
                if not self._drain_round():
                    break
        await self._settle()
        self._check()
        await self._settle_by_hand()
        stuck = [op for op in self.db.rows.values() if op.state in (State.IN_FLIGHT, State.UNKNOWN)]
        if stuck:
            problems = [
                Problem(
                    "settles-eventually",
                    f"{op.id} is still {op.state.value} (attempt {op.attempts}, token "
                    f"{op.token}) after the drain",
                )
                for op in stuck
            ]
            raise self._violation(problems)

    async def _settle_by_hand(self) -> None:
        """What the probe may not release, a person settles, as its evidence says to: an
        operator checks the upstream (the truth, blind paths included) and resolves each
        `unknown` operation whose last probe verdict left it to a person. Nothing else
        is settled here, so an operation a probe should have settled still shows."""
        left = [
            op
            for op in self.db.rows.values()
            if op.state is State.UNKNOWN and self._last_probe_verdict(op.id) in REFUSED_BY_PROBE
        ]
        if not left:
            return
        replica = self._live()[0]
        for operation in left:
            label = self._label(replica, f"operator(admin) {operation.scope}/{operation.key}")
            self._note(f"start {label} (by hand: {self._last_probe_verdict(operation.id)})")
            replica.start(
                label,
                partial(
                    self.calls.operator,
                    replica,
                    label,
                    operation.scope,
                    operation.key,
                    "admin",
                    with_version=True,
                    with_response=True,
                    insist=False,
                ),
            )
        for _ in range(60):
            await self._settle()
            self._check()
            if not self._drain_round():
                break

    def _last_probe_verdict(self, operation_id: str) -> str | None:
        for row in reversed(self.db.events.get(operation_id, [])):
            if row.type == "probe":
                verdict = json.loads(row.data).get("verdict")
                return verdict if isinstance(verdict, str) else None
        return None

    def _drain_round(self) -> bool:
        progressed = False
        for _name, future in self._pending_store():
            future.set_result(None)
            progressed = True
        for send in self.upstream.pending_at_door():
            self.upstream.let_in(send)
            progressed = True
        for send in self.upstream.reply_pending():
            if send.effect == "pending":
                self.upstream.apply(send)
            self._answer(send)
            progressed = True
        for probe in self.upstream.pending_probes():
            self.upstream.answer_probe(probe)
            progressed = True
        for replica in self._live():
            if replica.keeper.debts or len(replica.tasks) > self._loops:
                label = self._label(replica, "drain upkeep")
                self._background(replica, label, replica.keeper.upkeep)
        if progressed:
            self._note("drain round: released every parked call")
        return progressed
