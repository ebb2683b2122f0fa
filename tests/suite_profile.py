"""How much of each property the suite runs: a share in `make test`, all of it in `make test-full`.

The slowest properties (schemathesis over the OpenAPI document, hypothesis tests with
hundreds of examples, the simulation's seeds, the benchmarks' smoke runs) cost minutes at
their full counts. `make test` runs the fast profile, so the suite that runs on every
change stays short; `make test-full` sets `GATEWAY_TEST_PROFILE=full` and runs every count
exactly as written in the tests. A bare `pytest` runs the fast profile.

A test states its full count and, where a quarter of it would not do, its own fast one:
`@settings(max_examples=examples(300))`, `RUN_SEEDS = examples(800, fast=30)`.
"""

from __future__ import annotations

import os

from hypothesis import settings

PROFILE_ENV = "GATEWAY_TEST_PROFILE"
"""The environment variable that picks the profile (`make test-full` sets it to `full`)."""

FAST = "fast"
FULL = "full"
PROFILES = (FAST, FULL)

FAST_SHARE = 4
"""The fast profile runs a quarter of a count that names no fast count of its own."""

HYPOTHESIS_DEFAULT_EXAMPLES = 100
"""hypothesis's own `max_examples`: what a `@given` test without one runs in `make test-full`."""


def profile() -> str:
    """The profile this run uses; an unknown name is an error, not a silent fast run."""
    name = os.environ.get(PROFILE_ENV, FAST) or FAST
    if name not in PROFILES:
        raise ValueError(f"{PROFILE_ENV}={name!r}: expected one of {', '.join(PROFILES)}")
    return name


def is_full() -> bool:
    """Whether every property runs its full count (`make test-full`)."""
    return profile() == FULL


def examples(full: int, *, fast: int | None = None) -> int:
    """The count a test runs: `full` in the full profile; in the fast one `fast` when the
    test names it (a count chosen for what that test must still meet), else a quarter of
    `full`, at least 1."""
    if is_full():
        return full
    if fast is not None:
        return min(fast, full)
    return max(1, full // FAST_SHARE)


def load_hypothesis_profile() -> None:
    """Register both profiles with hypothesis and load this run's: `full` is hypothesis's
    own defaults (today's counts), `fast` a quarter of its examples. Tests that set
    `max_examples` themselves take it from `examples`."""
    settings.register_profile(FULL, settings())
    settings.register_profile(
        FAST, settings(max_examples=HYPOTHESIS_DEFAULT_EXAMPLES // FAST_SHARE)
    )
    settings.load_profile(profile())
