"""Metrics across worker processes: prometheus_client's multiprocess mode, kept in one place.

With `[server] workers = N` a scrape lands on one worker but must count them all.
The supervisor sets `PROMETHEUS_MULTIPROC_DIR` (an empty directory it owns) in
each worker's environment before the worker starts; prometheus_client then backs
every value with a per-process mmap file there, and any worker can sum the files.
Without the variable nothing here is used and each application keeps its own
in-memory registry, as tests and single-process serving need.

>>> shared_directory() is None  # tests run without the variable
True
"""

from __future__ import annotations

import os
from typing import Final

from prometheus_client import CollectorRegistry, values
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import Collector

MULTIPROC_ENV: Final = "PROMETHEUS_MULTIPROC_DIR"
"""The variable the supervisor sets in each worker's environment (before the worker starts)."""

_claimed_by_pid: int | None = None


def shared_directory() -> str | None:
    """The directory the workers share, or `None` when values live in this process only.

    Asks which value class prometheus_client chose when it was imported, not just the
    environment: a variable set after that import would render files this process
    never writes to.
    """
    if values.ValueClass is values.MutexValue:
        return None
    directory = os.environ.get(MULTIPROC_ENV)
    if not directory:
        raise RuntimeError(
            f"prometheus_client is in multiprocess mode but {MULTIPROC_ENV} is unset"
        )
    return directory


def claim_process() -> None:
    """Refuse a second set of instruments in one worker.

    Two instruments of the same name in one process share an mmap slot but each
    keeps its own copy of the value, so their writes overwrite each other and
    counts are silently lost. One `GatewayMetrics` per worker is the rule.
    """
    global _claimed_by_pid
    pid = os.getpid()
    if _claimed_by_pid == pid:
        raise RuntimeError(
            "a second GatewayMetrics in one worker process would overwrite the first's"
            f" values in {MULTIPROC_ENV}; build one per process"
        )
    _claimed_by_pid = pid


def aggregating_registry(directory: str, *local: Collector) -> CollectorRegistry:
    """A registry that sums every worker's files, plus collectors no file can hold.

    The `Info` build metric has no multiprocess form; every worker runs the same
    build, so this worker's own copy stands for all. The registry can be kept:
    the collector reads the directory afresh on each scrape.
    """
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=directory)  # type: ignore[no-untyped-call]  # untyped upstream
    for collector in local:
        registry.register(collector)
    return registry


def forget_dead_worker(pid: int, directory: str | os.PathLike[str] | None = None) -> None:
    """For the supervisor: once worker `pid` is reaped, before its replacement starts.

    Drops the dead worker's `live*` gauges, so its last `ready` cannot hold the
    aggregate at 0. Its counters and histograms stay on disk and keep counting
    in the totals, so rates do not dip when a worker is replaced. Not before the
    reaping: until then no new process can get the pid and lose its own gauges here.
    `directory` defaults to `PROMETHEUS_MULTIPROC_DIR`, which a supervisor usually
    sets only in its workers' environment, so pass it.
    """
    path = os.fspath(directory) if directory is not None else os.environ.get(MULTIPROC_ENV)
    if not path:
        raise ValueError(f"no metrics directory: pass one or set {MULTIPROC_ENV}")
    mark_process_dead(pid, path)  # type: ignore[no-untyped-call]  # untyped upstream
