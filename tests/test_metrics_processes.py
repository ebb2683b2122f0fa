"""/metrics with worker processes: one scrape, any worker, every worker's counts.

Each worker's `GatewayMetrics` publishes a snapshot to a shared directory and
a scrape sums them (`gateway.web.metrics_processes`). Two instances with their
own worker names stand for two processes here: the snapshots are files, so
nothing else is shared between them. tests/test_workers.py scrapes real workers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from gateway.engine.models import State
from gateway.web.metrics import GatewayMetrics
from gateway.web.metrics_processes import WorkerSnapshots, forget_dead_worker

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def worker(directory: Path, name: str) -> GatewayMetrics:
    metrics = GatewayMetrics(version="9.9.9-test")
    metrics.share(WorkerSnapshots(directory, name))
    return metrics


def record(metrics: GatewayMetrics, *, forwarded: int, upstream: float, operations: int) -> None:
    for _ in range(forwarded):
        metrics.request("tickets", "forwarded")
    metrics.request("tickets", "replayed")
    metrics.upstream_call("tickets", upstream)
    metrics.set_operation_counts({state: operations for state in State}, 0.0)
    metrics.ready.set(1)


def parse(text: str) -> tuple[list[Any], Samples]:
    families = list(text_string_to_metric_families(text))
    samples: Samples = {}
    for family in families:
        for sample in family.samples:
            key = (sample.name, frozenset(sample.labels.items()))
            assert key not in samples, f"duplicate sample {key}"
            samples[key] = sample.value
    return families, samples


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def test_one_scrape_sums_every_workers_snapshot(tmp_path: Path) -> None:
    """Counters and histograms are summed; the store's operation counts are the scraping
    worker's own (one store, not a sum); the build info appears once."""
    first, second = worker(tmp_path, "101"), worker(tmp_path, "102")
    record(first, forwarded=3, upstream=0.25, operations=5)
    record(second, forwarded=4, upstream=0.5, operations=8)
    second.publish()

    families, samples = parse(first.render().decode())
    assert len({family.name for family in families}) == len(families)
    requests = "idempotency_gateway_requests_total"
    assert value(samples, requests, route="tickets", outcome="forwarded") == 7
    assert value(samples, requests, route="tickets", outcome="replayed") == 2
    duplicates = "idempotency_gateway_duplicates_suppressed_total"
    assert value(samples, duplicates, route="tickets") == 2
    upstream = "idempotency_gateway_upstream_seconds"
    assert value(samples, upstream + "_count", route="tickets") == 2
    assert value(samples, upstream + "_sum", route="tickets") == 0.75
    assert value(samples, upstream + "_bucket", route="tickets", le="+Inf") == 2
    assert value(samples, "idempotency_gateway_operations", state="unknown") == 5
    assert value(samples, "idempotency_gateway_build_info", version="9.9.9-test") == 1


def test_the_sum_reads_as_one_process_doing_all_the_work(tmp_path: Path) -> None:
    """Every sample a merged scrape shows is what one process doing both workers' work
    shows, buckets in order included (the operation counts aside: those are one store's)."""
    first, second = worker(tmp_path, "1"), worker(tmp_path, "2")
    record(first, forwarded=2, upstream=0.004, operations=1)
    record(second, forwarded=5, upstream=3.0, operations=1)
    second.publish()
    alone = GatewayMetrics(version="9.9.9-test")
    record(alone, forwarded=2, upstream=0.004, operations=1)
    record(alone, forwarded=5, upstream=3.0, operations=1)

    merged_text, alone_text = first.render().decode(), alone.render().decode()
    assert parse(merged_text)[1] == parse(alone_text)[1]
    bucket_lines = [line for line in merged_text.splitlines() if "upstream_seconds_bucket" in line]
    expected = [line for line in alone_text.splitlines() if "upstream_seconds_bucket" in line]
    assert bucket_lines == expected


def test_a_dead_worker_stops_counting_as_not_ready_but_its_counts_stay(tmp_path: Path) -> None:
    """`ready` is the least over live workers: a not-ready worker holds it at 0 until the
    supervisor forgets it, and its requests still count after that."""
    live, dead = worker(tmp_path, "201"), worker(tmp_path, "202")
    record(live, forwarded=1, upstream=0.1, operations=0)
    record(dead, forwarded=6, upstream=0.1, operations=0)
    dead.ready.set(0)
    dead.publish()
    assert value(parse(live.render().decode())[1], "idempotency_gateway_ready") == 0

    forget_dead_worker(202, tmp_path)
    samples = parse(live.render().decode())[1]
    assert value(samples, "idempotency_gateway_ready") == 1
    forwarded = value(
        samples, "idempotency_gateway_requests_total", route="tickets", outcome="forwarded"
    )
    assert forwarded == 7


def test_unshared_metrics_stay_their_own(tmp_path: Path) -> None:
    """A gateway of one process (and every in-process test app) renders only its registry,
    and writes nothing anywhere."""
    one, other = GatewayMetrics(), GatewayMetrics()
    one.request("tickets", "forwarded")
    samples = parse(other.render().decode())[1]
    assert (
        value(samples, "idempotency_gateway_requests_total", route="tickets", outcome="forwarded")
        is None
    )
    one.publish()
    assert list(tmp_path.iterdir()) == []
