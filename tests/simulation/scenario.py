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

from gateway.config import IdempotencySettings, ProbeSettings, RouteSettings

__all__ = ["PROBE_PATH", "REQUEST_PATH", "Scenario"]

PROBE_PATH = "/v1/effects?ref={operation_id}"
REQUEST_PATH = "/tickets/v1/issues"
UPSTREAM = "http://upstream.sim"
MAX_STORED_RESPONSE = 256
"""Small, so some answers are too large to keep and take the relay path."""


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

    @classmethod
    def draw(cls, seed: int, *, replicas: int | None = None, steps: int | None = None) -> Scenario:
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
        )

    def route(self) -> RouteSettings:
        return RouteSettings(
            name="tickets",
            prefix="/tickets",
            upstream=UPSTREAM,
            forward_key="operation_id",
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
        )
