"""/metrics with worker processes: one scrape, any worker, every worker's counts.

Real processes share a real `PROMETHEUS_MULTIPROC_DIR`: prometheus_client picks
its mmap-backed values at import, so multiprocess mode cannot be switched on
inside the test process (and must not be: its apps keep their own registries).
Each subprocess runs `worker_main` below with a spec saying what to record.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, TypedDict

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.engine.models import State
from gateway.web.metrics import GatewayMetrics, forget_dead_worker
from gateway.web.metrics_processes import MULTIPROC_ENV, shared_directory

TESTS = Path(__file__).parent
ROOT = TESTS.parent
VERSION = "9.9.9-test"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


class Spec(TypedDict, total=False):
    forwarded: int
    replayed: int
    upstream: float
    operations: dict[str, int]
    ready: int
    render: bool
    second_instance: bool


def record(metrics: GatewayMetrics, spec: Spec) -> None:
    """What a worker did before the scrape, the same in a subprocess and in this one."""
    for _ in range(spec.get("forwarded", 0)):
        metrics.request("tickets", "forwarded")
    for _ in range(spec.get("replayed", 0)):
        metrics.request("tickets", "replayed")
    if "upstream" in spec:
        metrics.upstream_call("tickets", spec["upstream"])
    if "operations" in spec:
        counts = {State(state): n for state, n in spec["operations"].items()}
        metrics.set_operation_counts(counts, 0.0)
    if "ready" in spec:
        metrics.ready.set(spec["ready"])


def worker_main(spec: Spec) -> None:
    """A worker's part, run in a subprocess with the shared directory in its environment."""
    metrics = GatewayMetrics(version=VERSION)
    if spec.get("second_instance"):
        try:
            GatewayMetrics(version=VERSION)
        except RuntimeError as refused:
            sys.stdout.write(f"refused: {refused}")
        return
    record(metrics, spec)
    if spec.get("render"):
        sys.stdout.buffer.write(metrics.render())


_LAUNCH = f"import json, sys; sys.path.insert(0, {str(TESTS)!r}); "
_LAUNCH += "from test_metrics_processes import worker_main; worker_main(json.loads(sys.argv[1]))"


def start_worker(directory: Path, spec: Spec) -> subprocess.Popen[bytes]:
    env = {**os.environ, MULTIPROC_ENV: str(directory)}
    return subprocess.Popen(
        [sys.executable, "-c", _LAUNCH, json.dumps(spec)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def finish(worker: subprocess.Popen[bytes]) -> str:
    out, err = worker.communicate(timeout=20)
    assert worker.returncode == 0, err.decode()
    return out.decode()


def run_worker(directory: Path, spec: Spec) -> tuple[int, str]:
    """Run one worker to its exit: its pid (for forget_dead_worker) and its output."""
    worker = start_worker(directory, spec)
    return worker.pid, finish(worker)


def parse(text: str) -> tuple[list[Any], Samples]:
    """The families (in order, to count duplicates) and every sample by name and labels."""
    families = list(text_string_to_metric_families(text))
    samples = {
        (s.name, frozenset(s.labels.items())): s.value
        for family in families
        for s in family.samples
    }
    return families, samples


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def forwarded(samples: Samples) -> float | None:
    return value(
        samples, "idempotency_gateway_requests_total", route="tickets", outcome="forwarded"
    )


def without_operation_counts(samples: Samples) -> Samples:
    return {key: v for key, v in samples.items() if key[0] != "idempotency_gateway_operations"}


@pytest.fixture
def shared(tmp_path: Path) -> Path:
    directory = tmp_path / "metrics"
    directory.mkdir()
    return directory


# A worker that never checked readiness holds `ready` (livemin) at its initial 0: these did check.
FIRST: Spec = {
    "forwarded": 3,
    "replayed": 1,
    "upstream": 0.25,
    "operations": {"completed": 8},
    "ready": 1,
}
SECOND: Spec = {
    "forwarded": 4,
    "upstream": 0.5,
    "operations": {"completed": 5, "unknown": 1},
    "ready": 1,
}
SCRAPED: Spec = {"ready": 1, "render": True}


def test_one_scrape_sums_every_worker(shared: Path) -> None:
    """Counters and histograms add up, the operations gauge is the latest count, build once."""
    run_worker(shared, FIRST)
    run_worker(shared, SECOND)  # after FIRST has exited: its counts are the most recent
    families, samples = parse(run_worker(shared, SCRAPED)[1])

    names = [family.name for family in families]
    assert len(names) == len(set(names)), names
    assert forwarded(samples) == 7
    assert value(samples, "idempotency_gateway_duplicates_suppressed_total", route="tickets") == 1
    assert value(samples, "idempotency_gateway_upstream_seconds_count", route="tickets") == 2
    assert value(samples, "idempotency_gateway_upstream_seconds_sum", route="tickets") == 0.75
    bucket = "idempotency_gateway_upstream_seconds_bucket"
    assert value(samples, bucket, route="tickets", le="0.25") == 1
    # The latest count, not the sum (13) nor the largest (8).
    assert value(samples, "idempotency_gateway_operations", state="completed") == 5
    assert value(samples, "idempotency_gateway_operations", state="unknown") == 1
    assert value(samples, "idempotency_gateway_ready") == 1
    builds = [s for s in samples if s[0] == "idempotency_gateway_build_info"]
    assert builds == [("idempotency_gateway_build_info", frozenset({("version", VERSION)}))]


def test_aggregate_reads_like_one_process(shared: Path) -> None:
    """Names, labels and values as if one process did all the work: dashboards keep working."""
    first, second = start_worker(shared, FIRST), start_worker(shared, SECOND)
    finish(first), finish(second)
    families, samples = parse(run_worker(shared, SCRAPED)[1])

    alone = GatewayMetrics(version=VERSION)
    for spec in (FIRST, SECOND, SCRAPED):
        record(alone, spec)
    one_families, one_samples = parse(alone.render().decode())
    # The workers ran concurrently: which operation count is the latest is up to the clock.
    assert without_operation_counts(samples) == without_operation_counts(one_samples)
    # Families without samples (no child yet) are left out of the aggregate, nothing else.
    types = {family.name: family.type for family in families}
    one_types = {family.name: family.type for family in one_families if family.samples}
    assert types == one_types


def test_dead_worker_leaves_readiness_but_keeps_counting(shared: Path) -> None:
    """Once forgotten, a dead worker's 0 no longer holds `ready` down; its counts still count."""
    dead_pid, _ = run_worker(shared, {"forwarded": 3, "ready": 0})
    live: Spec = {"forwarded": 4, **SCRAPED}

    _, before = parse(run_worker(shared, live)[1])
    assert value(before, "idempotency_gateway_ready") == 0
    assert forwarded(before) == 7

    # The supervisor's call, from a process whose own environment lacks the variable.
    forget_dead_worker(dead_pid, shared)
    _, after = parse(run_worker(shared, SCRAPED)[1])
    assert value(after, "idempotency_gateway_ready") == 1
    assert forwarded(after) == 7


def test_a_second_instance_in_one_worker_is_refused(shared: Path) -> None:
    """Two instances in one worker would overwrite each other's mmap values: refused instead."""
    _, out = run_worker(shared, {"second_instance": True})
    assert out.startswith("refused: a second GatewayMetrics in one worker process")


def test_without_the_variable_apps_keep_their_own_registries() -> None:
    """Tests and single-process serving: several instances in one process do not share counts."""
    assert shared_directory() is None, f"run the tests without {MULTIPROC_ENV}"
    one, other = GatewayMetrics(), GatewayMetrics()
    one.request("tickets", "forwarded")
    _, samples = parse(one.render().decode())
    _, other_samples = parse(other.render().decode())
    assert forwarded(samples) == 1
    assert forwarded(other_samples) is None


def test_forgetting_needs_a_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MULTIPROC_ENV, raising=False)
    with pytest.raises(ValueError, match=MULTIPROC_ENV):
        forget_dead_worker(12345)
