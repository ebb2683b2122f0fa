"""Run seeds one after another until a time budget is spent, or replay one seed.

    python -m tests.simulation --seconds 600            # seeds 1, 2, 3, ... for 10 minutes
    python -m tests.simulation --seed 1234              # replay one seed, trace on stdout
    python -m tests.simulation --seconds 60 --first 5000 --replicas 3
    python -m tests.simulation --seconds 60 --lost-keys  # agents that lose their keys
    python -m tests.simulation --seed 3 --lost-keys --similar-guard off  # twin-effect bites
    python -m tests.simulation --seed 5 --lost-keys --byte-fingerprints  # twin-effect bites
    python -m tests.simulation --seconds 60 --clock-step-window  # store clock steps that last

Exits 1 at the first invariant violation, after printing the seed, the step,
what broke and the last steps of the trace. `PYTHONHASHSEED` is pinned (the
process re-executes itself once) so a seed replays the same in any process.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import sys
import time
from collections import Counter
from collections.abc import Sequence

from tests.simulation.scenario import Scenario, SimilarGuardSetting
from tests.simulation.simulator import InvariantViolation, RunReport, Simulation

__all__ = ["main", "run_seed", "run_seeds"]

HASH_SEED = "0"
PROGRESS_EVERY = 15.0
"""Seconds between progress lines of a long run."""
WINDOW_STEPS = 4.0
"""`--clock-step-window`: how often the store's clock steps in a seed that drew no steps."""


def run_seed(
    seed: int,
    *,
    replicas: int | None = None,
    steps: int | None = None,
    echo: bool = False,
    keep_trace: bool = False,
    tolerate: frozenset[str] = frozenset(),
    lost_keys: bool = False,
    similar_guard: SimilarGuardSetting = "unsettled",
    byte_fingerprints: bool = False,
    clock_step_window: bool = False,
) -> tuple[RunReport, list[str] | None]:
    """One seed on a fresh event loop; raises `InvariantViolation`.

    `lost_keys`: the seed's world is `Scenario.losing_keys` (agents that lose keys);
    `similar_guard`: the route's guard (`off` only to see `twin-effect` bite);
    `byte_fingerprints`: version-1 fingerprints (only to see `twin-effect` bite on
    re-serialised bodies); `clock_step_window`: the store clock's steps last a stretch of
    world time, not one claim (`Scenario.clock_step_window`), in every seed."""
    draw = Scenario.losing_keys if lost_keys else Scenario.draw
    scenario = draw(seed, replicas=replicas, steps=steps)
    if similar_guard != scenario.similar_guard:
        scenario = dataclasses.replace(scenario, similar_guard=similar_guard)
    if byte_fingerprints:
        scenario = dataclasses.replace(scenario, canonical_json=False)
    if clock_step_window:  # steps that last a while, in every seed
        steps_rate = scenario.clock_steps or WINDOW_STEPS
        scenario = dataclasses.replace(scenario, clock_step_window=True, clock_steps=steps_rate)
    simulation = Simulation(
        scenario,
        echo=print if echo else None,
        keep_trace=keep_trace,
        tolerate=tolerate,
    )
    report = asyncio.run(simulation.run())
    return report, simulation.full_trace


def run_seeds(
    seconds: float,
    *,
    first: int = 1,
    replicas: int | None = None,
    max_seeds: int | None = None,
    out: bool = True,
    tolerate: frozenset[str] = frozenset(),
    lost_keys: bool = False,
    similar_guard: SimilarGuardSetting = "unsettled",
    byte_fingerprints: bool = False,
    clock_step_window: bool = False,
) -> list[RunReport]:
    """Seeds `first`, `first + 1`, ... until `seconds` pass (or `max_seeds` ran)."""
    started = time.monotonic()
    deadline = started + seconds
    progress = started + PROGRESS_EVERY
    reports: list[RunReport] = []
    steps = 0
    seed = first
    while time.monotonic() < deadline and (max_seeds is None or len(reports) < max_seeds):
        report, _ = run_seed(
            seed,
            replicas=replicas,
            tolerate=tolerate,
            lost_keys=lost_keys,
            similar_guard=similar_guard,
            byte_fingerprints=byte_fingerprints,
            clock_step_window=clock_step_window,
        )
        reports.append(report)
        steps += report.steps
        if out and time.monotonic() >= progress:
            progress += PROGRESS_EVERY
            elapsed = time.monotonic() - started
            print(
                f"  {elapsed:5.0f}s  {len(reports)} seeds  {steps} steps  (last seed {seed})",
                flush=True,
            )
        seed += 1
    return reports


def summary(reports: Sequence[RunReport], seconds: float) -> str:
    """The table printed at the end of a run."""
    actions: Counter[str] = Counter()
    faults: Counter[str] = Counter()
    excused: Counter[str] = Counter()
    states: Counter[str] = Counter()
    transitions: Counter[str] = Counter()
    twins: Counter[str] = Counter()
    classes: Counter[str] = Counter()
    for report in reports:
        for name in report.scenario.fault_classes():
            classes[f"{name}: seeds"] += 1
            classes[f"{name}: steps"] += report.steps
        transitions.update(report.transitions)
        twins.update(report.twins)
        actions.update(report.actions)
        faults.update(report.faults)
        excused.update(report.excused)
        states.update(report.final_states)
    steps = sum(r.steps for r in reports)
    rows = [
        ("seeds", len(reports)),
        ("steps", steps),
        ("steps/second", round(steps / seconds) if seconds else 0),
        ("upstream sends", sum(r.sends for r in reports)),
        ("upstream effects", sum(r.effects for r in reports)),
        ("probes", sum(r.probes for r in reports)),
    ]
    lines = ["", "summary", "-------"]
    lines += [f"{name:<46}{value:>10}" for name, value in rows]
    for title, counter in (
        ("fault classes drawn (seeds and steps with each)", classes),
        ("actions (interleavings)", actions),
        ("store faults fired", faults),
        ("answer-state mismatches excused", excused),
        ("the same request under another key", twins),
        ("committed writes (store history)", transitions),
        ("records left at the end", states),
    ):
        if counter:
            lines += ["", title]
            lines += [f"  {name:<44}{count:>10}" for name, count in counter.most_common()]
    return "\n".join(lines)


def _pin_hash_seed(argv: Sequence[str]) -> None:
    if os.environ.get("PYTHONHASHSEED") != HASH_SEED:
        env = dict(os.environ, PYTHONHASHSEED=HASH_SEED)
        os.execve(sys.executable, [sys.executable, "-m", "tests.simulation", *argv], env)


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m tests.simulation", description=__doc__)
    parser.add_argument("--seconds", type=float, default=60.0, help="time budget (default 60)")
    parser.add_argument("--seed", type=int, help="replay this one seed, printing its trace")
    parser.add_argument("--first", type=int, default=1, help="first seed of a run (default 1)")
    parser.add_argument("--replicas", type=int, choices=(2, 3), help="default: drawn per seed")
    parser.add_argument("--quiet", action="store_true", help="with --seed: no trace")
    parser.add_argument(
        "--lost-keys",
        action="store_true",
        help="agents send some retries under a fresh key, some of them marked distinct",
    )
    parser.add_argument(
        "--similar-guard",
        choices=("unsettled", "all", "off"),
        default="unsettled",
        help="the route's similar_guard (off: to see the twin-effect invariant bite)",
    )
    parser.add_argument(
        "--byte-fingerprints",
        action="store_true",
        help="fingerprints compare bytes (version 1): to see the twin-effect invariant bite",
    )
    parser.add_argument(
        "--clock-step-window",
        action="store_true",
        help="the store clock's short steps last a stretch of time, not one claim",
    )
    parser.add_argument(
        "--tolerate",
        action="append",
        default=[],
        choices=("after-store-error", "other-operation", "relay", "plain"),
        help="count answer-state mismatches of this class instead of failing (a known bug)",
    )
    args = parser.parse_args(args_list)
    if argv is None:
        _pin_hash_seed(args_list)
    logging.disable(logging.CRITICAL)  # the engine's own logs would drown the trace

    tolerate = frozenset(args.tolerate)
    started = time.monotonic()
    if args.seed is not None:
        try:
            report, _ = run_seed(
                args.seed,
                replicas=args.replicas,
                echo=not args.quiet,
                tolerate=tolerate,
                lost_keys=args.lost_keys,
                similar_guard=args.similar_guard,
                byte_fingerprints=args.byte_fingerprints,
                clock_step_window=args.clock_step_window,
            )
        except InvariantViolation as violation:
            print(violation, flush=True)
            return 1
        print(summary([report], time.monotonic() - started))
        print(f"\nseed {args.seed}: ok (trace digest {report.trace_digest})")
        return 0

    print(f"running seeds from {args.first} for {args.seconds:.0f}s", flush=True)
    try:
        reports = run_seeds(
            args.seconds,
            first=args.first,
            replicas=args.replicas,
            tolerate=tolerate,
            lost_keys=args.lost_keys,
            similar_guard=args.similar_guard,
            byte_fingerprints=args.byte_fingerprints,
            clock_step_window=args.clock_step_window,
        )
    except InvariantViolation as violation:
        print(violation, flush=True)
        print(f"\nFAILED: seed {violation.seed} (step {violation.step})", flush=True)
        return 1
    print(summary(reports, time.monotonic() - started))
    print(f"\nall {len(reports)} seeds passed", flush=True)
    return 0
