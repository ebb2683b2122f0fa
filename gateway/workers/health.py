"""How many of a gateway's workers serve, whether that makes it degraded, how many were
restarted: what the supervisor tells its workers (for `/readyz`) and the scrapes.

A restart takes a second or two, so a load balancer that reads `/readyz` should
not take the gateway out for each one, only for a slot that stays empty: the
gateway is degraded once fewer workers than configured have served for
`DEGRADED_SECONDS`. The clock starts when the first worker listens.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from prometheus_client import CollectorRegistry

from gateway.web.metrics import worker_restarts_counter
from gateway.web.metrics_processes import SUPERVISOR, WorkerSnapshots
from gateway.workers.channel import WorkersServing

log = logging.getLogger("gateway.workers")

DEGRADED_SECONDS = 10.0
"""Fewer workers than configured serve for longer than this: `/readyz` says degraded."""


class WorkersHealth:
    """The supervisor's count of serving workers and restarts.

    >>> health = WorkersHealth(3)
    >>> health.serving_changed(2); health.report().degraded
    False
    """

    def __init__(self, workers: int) -> None:
        self._workers = workers
        self._serving = 0
        self._short_since: float | None = None
        self._degraded = False
        self._counts = CollectorRegistry(auto_describe=True)
        self._restarts = worker_restarts_counter(self._counts)
        self.metrics_directory = ""
        """Where the supervisor's own snapshot goes (`worker_restarts_total`)."""

    def serving_changed(self, serving: int) -> None:
        """A worker started serving or died: `serving` of them serve now."""
        self._serving = serving
        if serving >= self._workers:
            self._short_since = None
        elif self._short_since is None:
            self._short_since = time.monotonic()

    def report(self) -> WorkersServing:
        """What the workers are told; logs when the gateway turns degraded or whole again."""
        short_for = 0.0 if self._short_since is None else time.monotonic() - self._short_since
        degraded = self._short_since is not None and short_for >= DEGRADED_SECONDS
        if degraded != self._degraded:
            self._degraded = degraded
            if degraded:
                log.warning(
                    "%d of %d workers serve, fewer than all for %.0fs: /readyz answers degraded",
                    self._serving,
                    self._workers,
                    short_for,
                    extra={"event": "workers_degraded", "serving": self._serving},
                )
            else:
                log.info("all %d workers serve again", self._workers)
        return WorkersServing(self._serving, self._workers, degraded=degraded)

    def count_restart(self) -> None:
        """One more replacement worker: `worker_restarts_total` in every worker's scrape."""
        self._restarts.inc()
        try:
            WorkerSnapshots(Path(self.metrics_directory), SUPERVISOR).publish(self._counts)
        except OSError as exc:  # a full disk must not stop the restarts
            log.warning("cannot publish the restart count: %s", exc)
