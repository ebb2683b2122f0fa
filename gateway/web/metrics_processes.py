"""Metrics across worker processes: each worker publishes a snapshot, any worker sums them.

With `[server] workers = N` a scrape lands on one worker but must count them
all. prometheus-client's multiprocess mode does that by writing every value
through an mmap'd file: measured here, that cost 20-30 us of CPU per miss
(about 0.4 us more per value, ten-odd values per request), 5-7% of the
request. So each worker keeps the fast in-memory registry a single process
has, and writes a snapshot of it to the supervisor's directory once a second
(`SNAPSHOT_SECONDS`) and when it stops; a scrape publishes its own worker's
snapshot and sums everyone's:

- counters and histograms: summed over every snapshot, a dead worker's
  included, so totals never drop when a worker is replaced (what it counted in
  the second before it was killed is lost);
- `ready`: the least over live workers' snapshots (the supervisor drops a dead
  worker's gauges, `forget_dead_worker`);
- the other gauges (`operations`, counted from the one shared store) and the
  build info: the scraping worker's own, which it has just refreshed.

Another worker's counts are at most `SNAPSHOT_SECONDS` old in a scrape.

The supervisor publishes a snapshot of its own too (`SUPERVISOR`, never
forgotten), of what only it knows: `worker_restarts_total`, summed in as
a worker's counters are.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

SNAPSHOT_SECONDS = 1.0
SUPERVISOR = "supervisor"
"""The supervisor's snapshot's name in the directory (the workers' are their pids)."""
SUMMED = frozenset({"counter", "histogram", "summary"})
LEAST_OVER_WORKERS = frozenset({"idempotency_gateway_ready"})
"""Gauges that read the least live worker's value; other gauges are the scraping worker's."""

_Key = tuple[str, tuple[tuple[str, str], ...]]


class WorkerSnapshots:
    """One worker's view of the shared directory: it writes its file, it reads them all."""

    def __init__(self, directory: Path, worker: str | None = None) -> None:
        self.directory = directory
        self._worker = worker or str(os.getpid())

    def publish(self, registry: CollectorRegistry) -> None:
        """Write this worker's snapshot (atomically: a scrape never reads half of one)."""
        families = [_snapshot_of(metric) for metric in registry.collect()]
        path = self.directory / f"{self._worker}.json"
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(families, separators=(",", ":")))
        os.replace(temporary, path)

    def registry(self, local: CollectorRegistry) -> CollectorRegistry:
        """A registry that renders every worker's snapshot merged, and `local` where the
        scraping worker's own value is the one to show."""
        merged = CollectorRegistry(auto_describe=False)
        merged.register(_Merged(self.directory, local))
        return merged


def forget_dead_worker(worker: int | str, directory: str | os.PathLike[str]) -> None:
    """For the supervisor, once a worker (its pid) is reaped: drop its gauges from the
    shared directory (its `ready` no longer counts), keep its counters and histograms."""
    path = Path(directory) / f"{worker}.json"
    with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):
        families = json.loads(path.read_text())
        kept = [family for family in families if family["type"] in SUMMED]
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(kept, separators=(",", ":")))
        os.replace(temporary, path)


class _Merged(Collector):
    def __init__(self, directory: Path, local: CollectorRegistry) -> None:
        self._directory = directory
        self._local = local

    def collect(self) -> Iterator[Metric]:
        snapshots = list(_read_all(self._directory))
        for metric in self._local.collect():
            if metric.type in SUMMED:
                yield _summed(metric, snapshots)
            elif metric.name in LEAST_OVER_WORKERS:
                yield _least(metric, snapshots)
            else:
                yield metric


def _snapshot_of(metric: Metric) -> dict[str, Any]:
    return {
        "name": metric.name,
        "type": metric.type,
        "samples": [[s.name, s.labels, s.value] for s in metric.samples],
    }


def _read_all(directory: Path) -> Iterable[dict[str, dict[_Key, float]]]:
    """Each worker's snapshot: family name to {(sample name, labels): value}."""
    for path in sorted(directory.glob("*.json")):
        try:
            families = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue  # replaced or removed while being read: the next scrape has it
        yield {
            family["name"]: {
                (name, tuple(sorted(labels.items()))): float(value)
                for name, labels, value in family["samples"]
            }
            for family in families
        }


def _summed(metric: Metric, snapshots: list[dict[str, dict[_Key, float]]]) -> Metric:
    totals: dict[_Key, float] = {}
    for snapshot in snapshots:
        for key, value in snapshot.get(metric.name, {}).items():
            totals[key] = totals.get(key, 0.0) + value
    return _family_like(metric, totals)


def _least(metric: Metric, snapshots: list[dict[str, dict[_Key, float]]]) -> Metric:
    least: dict[_Key, float] = {}
    for snapshot in snapshots:
        for key, value in snapshot.get(metric.name, {}).items():
            least[key] = min(least.get(key, value), value)
    return _family_like(metric, least)


def _family_like(metric: Metric, values: dict[_Key, float]) -> Metric:
    family = Metric(metric.name, metric.documentation, metric.type, metric.unit)
    for (name, labels), value in sorted(values.items(), key=_bucket_order):
        family.add_sample(name, dict(labels), value)
    return family


_SUFFIX_ORDER = {"_bucket": 0, "_count": 1, "_sum": 2}


def _bucket_order(item: tuple[_Key, float]) -> tuple[tuple[tuple[str, str], ...], int, float]:
    """As prometheus_client orders them: by label set, then buckets in `le` order
    (`+Inf` last), `_count`, `_sum`."""
    (name, labels), _ = item
    others = tuple(pair for pair in labels if pair[0] != "le")
    bound = dict(labels).get("le")
    rank = _SUFFIX_ORDER.get(name[name.rfind("_") :], 3)
    return others, rank, float(bound) if bound is not None else 0.0
