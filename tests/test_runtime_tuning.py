"""The process-wide tuning `python -m gateway serve` applies once it listens."""

from __future__ import annotations

import subprocess
import sys

from gateway.web.serve import GC_YOUNG_THRESHOLD

_PROBE = """
import gc
from gateway.web.serve import tune_garbage_collector
before = gc.get_threshold()
tune_garbage_collector()
after = gc.get_threshold()
print(before[1:] == after[1:], after[0], gc.get_freeze_count() > 0)
"""


def test_tune_garbage_collector_freezes_start_up_and_raises_the_young_threshold() -> None:
    """Start-up objects leave the collector's view; only the young threshold changes.

    Run in a fresh interpreter: the tuning is process-wide and must not leak into
    the test process.
    """
    probe = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=60, check=True
    )
    same_older_thresholds, young, frozen = probe.stdout.split()
    assert same_older_thresholds == "True"
    assert int(young) == GC_YOUNG_THRESHOLD
    assert frozen == "True"


_LOOP_PROBE = """
import asyncio, sys
from gateway.web.serve import use_event_loop
installed = use_event_loop(sys.argv[1])
async def main():
    return type(asyncio.get_running_loop()).__module__
print(installed, asyncio.run(main()))
"""


def test_the_event_loop_is_uvloop_unless_asyncio_is_chosen() -> None:
    """`[server] loop`: uvloop by default (a dependency of the gateway), asyncio's own loop
    when chosen. In a fresh interpreter: the loop policy is process-wide."""

    def probe(choice: str) -> list[str]:
        run = subprocess.run(
            [sys.executable, "-c", _LOOP_PROBE, choice],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return run.stdout.split()

    assert probe("uvloop") == ["uvloop", "uvloop"]
    installed, module = probe("asyncio")
    assert (installed, module.split(".")[0]) == ("asyncio", "asyncio")
