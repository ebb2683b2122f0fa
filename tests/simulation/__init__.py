"""A deterministic simulation of the idempotency engine, in the spirit of FoundationDB's
simulator and TigerBeetle's VOPR: one seed drives replicas, a store, an upstream, clocks
and faults, and invariants are checked after every step.

Modules, one job each:

- `clock`: the world's time, the store's clock over it (which may step back for a moment),
  and skewed, steppable, pausable replica clocks;
- `memory_store`: the `Store` protocol in memory (probe calibration rows included), with
  the history of every committed write;
- `faults`: a replica's store link with lost and ambiguous commits, outages, death, latency;
- `upstream`: the scripted upstream, ground truth of effects, answers and probes (a probe
  that may be blind to some requests);
- `replica`: a production engine wired to those, one per simulated gateway process;
- `scenario`: what a seed's world looks like (settings, sizes, which faults are on);
- `invariants`: the promises checked after every step;
- `simulator`: the step loop, the actions, quiescence, the trace;
- `runner` and `__main__`: `python -m tests.simulation --seconds N [--seed S]`.
"""

from __future__ import annotations

from tests.simulation.scenario import Scenario
from tests.simulation.simulator import InvariantViolation, RunReport, Simulation

__all__ = ["InvariantViolation", "RunReport", "Scenario", "Simulation"]
