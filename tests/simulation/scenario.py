"""What one seed's world looks like: settings, sizes, and which faults are switched on.

"Swarm testing" (as in FoundationDB's and TigerBeetle's simulators): each
seed draws its own mix of fault classes and rates instead of running every
fault at a fixed low rate, so some seeds hammer one kind of trouble hard
enough to reach the rare interleavings it causes. Gateway settings are built
through the production pydantic models, so the simulation cannot run a
configuration the gateway would refuse.

The fault classes a seed may draw beside the replicas' own troubles (pauses,
crashes, skewed and stepped clocks, store faults and latency, a troubled
upstream): a second kind of request the probe cannot see (declared in its
`applies_to` or not), process pauses longer than a lease while a call is on
the wire, short backward steps of the store's clock, bodies re-serialised by
the agent (member order, whitespace, `1.0`, escapes, media type parameters,
query order), and keepers that renew on time (their own loop) or only when
the simulator says. Each is drawn after the older draws, so a seed keeps the
rest of its world when a class is added.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Literal

from gateway.config import IdempotencySettings, ProbeSettings, RouteSettings
from gateway.config.applies_to import upstream_path

__all__ = [
    "DISTINCT",
    "EMAILS_PATH",
    "LOST_KEYS",
    "OTHER_PATHS",
    "PROBE_PATH",
    "REQUEST_PATH",
    "V2_ISSUES_PATH",
    "Scenario",
    "SimilarGuardSetting",
]

SimilarGuardSetting = Literal["unsettled", "all", "off"]

PROBE_PATH = "/v1/effects?ref={operation_id}"
REQUEST_PATH = "/tickets/v1/issues"
"""The agents' requests (gateway terms: the route's prefix, then the upstream's path)."""
EMAILS_PATH = "/tickets/v1/emails"
"""A second kind of request (`POST /*/emails`), which the probe cannot see."""
V2_ISSUES_PATH = "/tickets/v2/issues"
"""A second path of the first request's kind (`POST /*/issues`) that the probe cannot see:
calibrating the kind with a `/v1/issues` sample passes, so only `applies_to` keeps the
probe's "not found" about these from releasing anything."""
OTHER_PATHS = (EMAILS_PATH, V2_ISSUES_PATH)
SEEN = "POST /v1/issues"
"""The `applies_to` entry of what the probe can see."""
OTHER_SHARE = 0.35
"""The share of requests that go to `Scenario.other_path`, when a seed has one."""
STORE_STEP = -3600.0
"""A short step of the store's clock: back an hour (`Scenario.clock_steps`)."""
UPSTREAM = "http://upstream.sim"
PREFIX = "/tickets"
MAX_STORED_RESPONSE = 256
"""Small, so some answers are too large to keep and take the relay path."""
LOST_KEYS = 0.2
"""`Scenario.losing_keys`: the fraction of retries its agents send under a fresh key."""
DISTINCT = 0.1
"""`Scenario.losing_keys`: the fraction of those its agents mark distinct."""


@dataclass(frozen=True, slots=True)
class Scenario:
    """Everything a seed decides before its first step."""

    seed: int
    replicas: int
    steps: int
    lease: float
    not_applied_after: float
    retention: float
    tombstone: float
    scopes: tuple[str, ...]
    keys: int
    skew: float
    """Largest |skew| a replica clock gets (0: clocks agree)."""
    pauses: bool
    crashes: bool
    store_faults: float
    """Rate of scripted store faults (lost and ambiguous commits, outages)."""
    store_latency: float
    """Probability a store call is parked until the simulator lets it through."""
    upstream_trouble: float
    """How often the upstream refuses, drops, times out or answers late."""
    lost_keys: float = 0.0
    """Fraction of an agent's retries sent under a fresh key (it lost the one it used):
    the same request, so the same fingerprint, under a key the store has never seen.
    0: every retry reuses a key of the call, and the run is exactly as before."""
    distinct: float = 0.0
    """Fraction of those fresh keys the agent marks distinct (`Idempotency-Distinct: ?1`:
    "a second effect is what I want"), which the similar-operation guard never refuses."""
    similar_guard: SimilarGuardSetting = "unsettled"
    """The route's guard against the same request under a new key (`off`: only to prove
    the `twin-effect` invariant notices a gateway without it)."""
    timeout: float = 30.0
    """The route's whole-call limit: a send (which leaves within its claim's lease) may
    still land this long after it left, and `not_applied_after` more; every release
    must wait that out."""
    other_path: str | None = None
    """A second path the agents send to (`OTHER_PATHS`), whose effects the probe cannot
    see: its "not found" about them is false. None: the agents send `REQUEST_PATH` only."""
    other_declared: bool = False
    """The probe's `applies_to` declares `other_path` all the same (only for a kind of its
    own, `EMAILS_PATH`): calibration must find the probe blind for it. Undeclared, a
    "not found" about it is evidence only."""
    long_pauses: bool = False
    """A replica may freeze while a call of its is on the wire, for longer than a lease
    (a VM paused, a process stopped), then wake up and read the answer."""
    clock_steps: float = 0.0
    """How often the store's clock steps back an hour (`STORE_STEP`, the weight of that
    step among the simulator's actions; 0: never) for less than a gateway's periodic
    witness interval (`gateway.engine.graces.WITNESS_INTERVAL`), then comes back: during
    one claim (the claim's reading is the witness that must see it). Each step is on its
    own: none begins within a witness interval of the last one's end, nor before every
    replica's periodic witness has read the clock since (`Simulation._clock_steady`)."""
    clock_step_window: bool = False
    """The steps last a stretch of world time under `WITNESS_INTERVAL` instead, whatever
    reads the clock meanwhile (a second claim, a renewal, a replica that starts or wakes
    up during one), each at least `UNWATCHED_GAP` after the last one ended. Drawn for half
    the seeds that draw steps."""
    reserialise: float = 0.0
    """Fraction of requests the agent sends re-serialised: the same JSON request in other
    bytes (member order, whitespace, `1.0` for `1`, an escaped character, `; charset=`,
    query order, a percent-escape). Their fingerprints are the production ones, computed
    from the bytes sent."""
    keeper_loop: bool = False
    """Each replica's lease keeper also runs its own loop (`LeaseKeeper.start`: a round
    every third of a lease of simulated time), as a gateway does, besides the rounds the
    simulator starts: leases then lapse only when a process or its store stalls, and a
    call the upstream holds long is renewed past its whole-call limit (the simulated
    forwarder does not enforce the route's `timeout`), so that its last lease expiry,
    not the limit, bounds its effect. Off: every round is the simulator's, which may be
    late, so leases lapse under a busy or slow keeper too."""
    canonical_json: bool = True
    """Fingerprints compare JSON as JSON (version 2). False (version 1, bytes: the
    production seam `testing.canonical_json`) only to prove `twin-effect` notices a
    gateway that takes a re-serialised request for another one."""

    @classmethod
    def draw(
        cls,
        seed: int,
        *,
        replicas: int | None = None,
        steps: int | None = None,
        lost_keys: float = 0.0,
        distinct: float = 0.0,
    ) -> Scenario:
        rng = random.Random(f"scenario-{seed}")
        lease = rng.choice((1.5, 2.0, 3.0))
        retention = rng.choice((4.0, 8.0, 20.0))
        world = cls(
            seed=seed,
            replicas=replicas if replicas is not None else rng.choice((2, 3)),
            steps=steps if steps is not None else rng.randint(200, 1000),
            lease=lease,
            not_applied_after=rng.choice((1.0, 3.0, 6.0)),
            retention=retention,
            tombstone=retention + rng.choice((0.0, 10.0, 40.0)),
            scopes=("alice", "bob")[: rng.choice((1, 2))],
            keys=rng.choice((2, 3, 5)),
            skew=rng.choice((0.0, 1.0, 5.0, 30.0)),
            pauses=rng.random() < 0.6,
            crashes=rng.random() < 0.5,
            store_faults=rng.choice((0.0, 0.02, 0.08)),
            store_latency=rng.choice((0.0, 0.1, 0.3)),
            upstream_trouble=rng.choice((0.1, 0.3, 0.6)),
            lost_keys=lost_keys,
            distinct=distinct,
        )
        # The third round's classes, drawn after the rest (every draw taken whatever
        # the earlier ones said, so each class's odds are its own).
        timeout = rng.choice((2.0, 5.0, 10.0, 30.0))
        other_roll, other_path, declared_roll = rng.random(), rng.choice(OTHER_PATHS), rng.random()
        other = other_path if other_roll < 0.45 else None
        long_pauses = rng.random() < 0.35
        clock_steps = rng.choice((0.0, 0.0, 0.0, 1.5, 4.0))
        reserialise = rng.choice((0.0, 0.0, 0.3, 0.7))
        keeper_loop = rng.random() < 0.5
        return replace(
            world,
            timeout=timeout,
            other_path=other,
            other_declared=other == EMAILS_PATH and declared_roll < 0.5,
            long_pauses=long_pauses,
            clock_steps=clock_steps,
            clock_step_window=clock_steps > 0 and rng.random() < 0.5,
            reserialise=reserialise,
            keeper_loop=keeper_loop,
        )

    @classmethod
    def losing_keys(
        cls, seed: int, *, replicas: int | None = None, steps: int | None = None
    ) -> Scenario:
        """`draw`'s world, with agents that lose their keys: `LOST_KEYS` of the retries
        under a fresh key, `DISTINCT` of those marked distinct."""
        return cls.draw(
            seed, replicas=replicas, steps=steps, lost_keys=LOST_KEYS, distinct=DISTINCT
        )

    def route(self) -> RouteSettings:
        """The route as the gateway is configured: its probe declares what it can see
        (`applies_to`, in the upstream's terms), and that it sees every caller's effects
        (the probe asks as the route, and the scripted upstream shows it every scope)."""
        applies_to: tuple[str, ...] = (SEEN,)
        if self.other_declared and self.other_path is not None:
            applies_to += (f"POST {upstream_path(PREFIX, self.other_path)}",)
        return RouteSettings(
            name="tickets",
            prefix=PREFIX,
            upstream=UPSTREAM,
            forward_key="operation_id",
            similar_guard=self.similar_guard,
            max_stored_response=MAX_STORED_RESPONSE,
            release_statuses=(429,),
            timeout=self.timeout,
            probe=ProbeSettings(
                path=PROBE_PATH,
                applied_statuses=(200,),
                not_applied_statuses=(404,),
                not_applied_after=self.not_applied_after,
                applies_to=applies_to,
                sees_all_callers=True,
            ),
        )

    def blind_paths(self) -> frozenset[str]:
        """The request paths (gateway terms, canonical) whose effects the probe cannot see."""
        return frozenset(() if self.other_path is None else (self.other_path,))

    def fault_classes(self) -> tuple[str, ...]:
        """The fault classes this seed drew, by name (the runner counts seeds and steps
        per class)."""
        blind = None
        if self.other_path is not None:
            declared = "declared" if self.other_declared else "undeclared"
            blind = f"probe blind to {upstream_path(PREFIX, self.other_path)} ({declared})"
        named = (
            ("replica pauses", self.pauses),
            ("crashes", self.crashes),
            ("clock skew", self.skew > 0),
            ("store faults", self.store_faults > 0),
            ("store latency", self.store_latency > 0),
            ("lost keys", self.lost_keys > 0),
            (blind or "", blind is not None),
            ("pauses longer than a lease", self.long_pauses),
            ("store clock steps back", self.clock_steps > 0),
            ("re-serialised bodies", self.reserialise > 0),
            ("keeper loop (leases renewed on time)", self.keeper_loop),
        )
        return tuple(name for name, on in named if on)

    def idempotency(self) -> IdempotencySettings:
        return IdempotencySettings(
            lease=self.lease, retention=self.retention, tombstone_retention=self.tombstone
        )

    def describe(self) -> str:
        return (
            f"replicas={self.replicas} steps={self.steps} lease={self.lease} "
            f"not_applied_after={self.not_applied_after} retention={self.retention} "
            f"tombstone={self.tombstone} scopes={len(self.scopes)} keys={self.keys} "
            f"skew<={self.skew} pauses={self.pauses} crashes={self.crashes} "
            f"store_faults={self.store_faults} latency={self.store_latency} "
            f"upstream_trouble={self.upstream_trouble} timeout={self.timeout}"
            + (f" lost_keys={self.lost_keys} distinct={self.distinct}" if self.lost_keys else "")
            + (f" similar_guard={self.similar_guard}" if self.similar_guard != "unsettled" else "")
            + (
                f" blind_to={self.other_path}"
                f" ({'declared' if self.other_declared else 'undeclared'})"
                if self.other_path is not None
                else ""
            )
            + (" long_pauses" if self.long_pauses else "")
            + (" keeper_loop" if self.keeper_loop else "")
            + (f" clock_steps={self.clock_steps}" if self.clock_steps else "")
            + (" (window)" if self.clock_steps and self.clock_step_window else "")
            + (f" reserialise={self.reserialise}" if self.reserialise else "")
            + ("" if self.canonical_json else " fingerprints=bytes")
        )
