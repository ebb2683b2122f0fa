"""Prometheus metrics: names fixed by the contract, labels bounded (never a key or scope).

Each application gets its own registry, so several gateways can live in one
test process and nothing leaks through prometheus_client's global default.
With worker processes, each worker also publishes a snapshot to the
supervisor's directory and `render()` shows every worker's sum
(`gateway.web.metrics_processes`). The supervisor serves no scrape, so what
only it knows (`worker_restarts_total`) it publishes to the same directory as
a snapshot of its own.
"""

from __future__ import annotations

from typing import Any, Final

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    disable_created_metrics,
    generate_latest,
)

from gateway.engine.models import State
from gateway.web.metrics_processes import WorkerSnapshots

# `_created` series double the output and no dashboard here uses them.
disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped upstream

PREFIX: Final = "idempotency_gateway_"

OUTCOMES: Final = (
    "forwarded",
    "replayed",
    "in_progress",
    "mismatch",
    "unknown",
    "released",
    "rejected",
)


def worker_restarts_counter(registry: CollectorRegistry) -> Counter:
    """The one definition of the restart counter, for both sides: the supervisor counts in
    its registry and publishes it; every worker's registry holds the family at 0, which
    is what makes a worker's `/metrics` sum the supervisor's snapshot in."""
    return Counter(
        PREFIX + "worker_restarts",
        "Worker processes started to replace one that died ([server] workers above 1).",
        registry=registry,
    )


_LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip


class GatewayMetrics:
    """All of the gateway's instruments, on one registry.

    >>> metrics = GatewayMetrics()
    >>> metrics.request("tickets", "replayed")
    >>> b"idempotency_gateway_duplicates_suppressed_total" in metrics.render()
    True
    """

    def __init__(self, *, version: str = "0") -> None:
        self._counted_at: float | None = None
        self._children: dict[tuple[Any, tuple[str, ...]], Any] = {}
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            PREFIX + "requests",
            "Protected requests by route and outcome.",
            ("route", "outcome"),
            registry=r,
        )
        self.duplicates_suppressed = Counter(
            PREFIX + "duplicates_suppressed",
            "Retries that did not reach the upstream (replays, in-progress and similar-operation "
            "refusals).",
            ("route",),
            registry=r,
        )
        self.operations = Gauge(
            PREFIX + "operations",
            "Stored operations by state.",
            ("state",),
            registry=r,
        )
        self.upstream_seconds = Histogram(
            PREFIX + "upstream_seconds",
            "Time from sending upstream to a complete answer or failure.",
            ("route",),
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.store_seconds = Histogram(
            PREFIX + "store_seconds",
            "Time of one store call, including the wait for its group commit.",
            ("operation",),
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.stale_writes = Counter(
            PREFIX + "stale_writes_refused",
            "Outcome writes refused because the writer's fencing token was stale.",
            ("route",),
            registry=r,
        )
        self.passthrough = Counter(
            PREFIX + "passthrough_requests",
            "Requests of unprotected methods proxied without records.",
            ("route",),
            registry=r,
        )
        self.commit_batch = Histogram(
            PREFIX + "store_commit_batch_size",
            "Store calls committed together in one durable transaction.",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
            registry=r,
        )
        self.unknown = Counter(
            PREFIX + "unknown_outcomes",
            "Operations that became unknown, by route and reason.",
            ("route", "reason"),
            registry=r,
        )
        self.lease_expirations = Counter(
            PREFIX + "lease_expirations",
            "In-flight leases that expired before an outcome was recorded.",
            registry=r,
        )
        self.probes = Counter(
            PREFIX + "probe_results",
            "Probe answers by route and result.",
            ("route", "result"),
            registry=r,
        )
        self.probe_blind_kinds = Gauge(
            PREFIX + "probe_blind",
            "1 while a route's probe is blind for requests an applies_to entry covers: its "
            '"not found" releases none of them until an operator trusts it (probes trust).',
            ("route", "applies_to"),
            registry=r,
        )
        self.late_answers = Counter(
            PREFIX + "late_answers",
            "Upstream answers recorded after their attempt lost its hold, by route and what "
            "they did: completed a released operation, attached a receipt, or evidence "
            "(possible_duplicate when a newer attempt was sent).",
            ("route", "outcome"),
            registry=r,
        )
        self.resolutions = Counter(
            PREFIX + "resolutions",
            "Unknown operations settled, by who settled them and the outcome.",
            ("by", "outcome"),
            registry=r,
        )
        self.swept = Counter(
            PREFIX + "swept",
            "Records changed by the retention sweep: receipt bodies dropped, tombstones forgotten.",
            ("kind",),
            registry=r,
        )
        self.store_errors = Counter(
            PREFIX + "store_errors",
            "Store calls that failed (the store was unavailable), by operation.",
            ("operation",),
            registry=r,
        )
        self.ready = Gauge(
            PREFIX + "ready",
            "1 when the store answered the last readiness check, else 0.",
            registry=r,
        )
        self.request_seconds = Histogram(
            PREFIX + "request_seconds",
            "Whole proxied request time in the gateway, by route (includes the upstream).",
            ("route",),
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.worker_restarts = worker_restarts_counter(r)
        self.build = Info(PREFIX + "build", "Gateway build information.", registry=r)
        self.build.info({"version": version})
        self._snapshots: WorkerSnapshots | None = None
        self._exposed = r
        """What `render()` shows: this registry, or every worker's snapshot once shared."""

    def share(self, snapshots: WorkerSnapshots) -> None:
        """As one of a gateway's workers: `publish()` to, and render from, the shared snapshots."""
        self._snapshots = snapshots
        self._exposed = snapshots.registry(self.registry)

    def publish(self) -> None:
        """Write this worker's snapshot (a no-op for a gateway of one process)."""
        if self._snapshots is not None:
            self._snapshots.publish(self.registry)

    def request(self, route: str, outcome: str) -> None:
        self._child(self.requests, route, outcome).inc()
        if outcome in ("replayed", "in_progress", "similar"):
            self._child(self.duplicates_suppressed, route).inc()

    def operation_counts_stale(self, now: float, ttl: float) -> bool:
        return self._counted_at is None or now - self._counted_at >= ttl

    def set_operation_counts(self, counts: dict[State, int], now: float) -> None:
        for state, count in counts.items():
            self.operations.labels(state.value).set(count)
        self._counted_at = now

    # LifecycleObserver
    def store_call(self, operation: str, seconds: float) -> None:
        self._child(self.store_seconds, operation).observe(seconds)

    def store_error(self, operation: str) -> None:
        self.store_errors.labels(operation).inc()

    def upstream_call(self, route: str, seconds: float) -> None:
        self._child(self.upstream_seconds, route).observe(seconds)

    def request_time(self, route: str, seconds: float) -> None:
        self._child(self.request_seconds, route).observe(seconds)

    def stale_write(self, route: str) -> None:
        self.stale_writes.labels(route).inc()

    def became_unknown(self, route: str, reason: str) -> None:
        self.unknown.labels(route, reason).inc()

    def lease_expired(self, count: int) -> None:
        if count:
            self.lease_expirations.inc(count)

    def probe_result(self, route: str, result: str) -> None:
        self.probes.labels(route, result).inc()

    def resolved(self, by: str, outcome: str) -> None:
        self.resolutions.labels(by, outcome).inc()

    def probe_blind(self, route: str, entry: str, blind: bool) -> None:
        self.probe_blind_kinds.labels(route, entry).set(1 if blind else 0)

    def late_answer(self, route: str, outcome: str) -> None:
        self.late_answers.labels(route, outcome).inc()

    def swept_records(self, receipts_expired: int, forgotten: int) -> None:
        self.swept.labels("receipt_expired").inc(receipts_expired)
        self.swept.labels("forgotten").inc(forgotten)

    def commit(self, batch_size: int) -> None:
        self.commit_batch.observe(batch_size)

    def render(self) -> bytes:
        self.publish()  # this worker's own counts are current in its own scrape
        return generate_latest(self._exposed)

    def _child(self, metric: Any, *labels: str) -> Any:
        """`metric.labels(*labels)`, remembered: `labels()` takes a lock and builds keys
        each call, and the hot path calls it several times per request."""
        key = (metric, labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child
