"""What one seed's world looks like: settings, sizes, and which faults are switched on.

"Swarm testing" (as in FoundationDB's and TigerBeetle's simulators): each
seed draws its own mix of fault classes and rates instead of running every
fault at a fixed low rate, so some seeds hammer one kind of trouble hard
enough to reach the rare interleavings it causes. Gateway settings are built
through the production pydantic models, so the simulation cannot run a
configuration the gateway would refuse.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

from gateway.config import IdempotencySettings, ProbeSettings, RouteSettings

__all__ = ["DISTINCT", "LOST_KEYS", "PROBE_PATH", "REQUEST_PATH", "Scenario", "SimilarGuardSetting"]

SimilarGuardSetting = Literal["unsettled", "all", "off"]

PROBE_PATH = "/v1/effects?ref={operation_id}"
REQUEST_PATH = "/tickets/v1/issues"
UPSTREAM = "http://upstream.sim"
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
        return cls(
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
        return RouteSettings(
            name="tickets",
            prefix="/tickets",
            upstream=UPSTREAM,
            forward_key="operation_id",
            similar_guard=self.similar_guard,
            max_stored_response=MAX_STORED_RESPONSE,
            release_statuses=(429,),
            probe=ProbeSettings(
                path=PROBE_PATH,
                applied_statuses=(200,),
                not_applied_statuses=(404,),
                not_applied_after=self.not_applied_after,
            ),
        )

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
            f"upstream_trouble={self.upstream_trouble}"
            + (f" lost_keys={self.lost_keys} distinct={self.distinct}" if self.lost_keys else "")
            + (f" similar_guard={self.similar_guard}" if self.similar_guard != "unsettled" else "")
        )
