"""Deployment artefacts stay true: dashboards and alerts name real metrics, the image lints,
and SIGTERM drains in-flight calls."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
from harness import GatewayProcess, RunningGateway, spawn
from upstream import CountingUpstream

ROOT = Path(__file__).resolve().parent.parent
METRIC = re.compile(r"\bidempotency_gateway_[a-z_]+")
SUFFIXES = ("_total", "_bucket", "_sum", "_count", "_info")


def referenced_metrics(path: Path) -> set[str]:
    return set(METRIC.findall(path.read_text()))


def family(name: str) -> str:
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name.removesuffix(suffix)
    return name


async def exposed_families(gateway: RunningGateway) -> set[str]:
    await gateway.post("/tickets/v1/issues", key="m1", json_body={})
    text = await (await gateway.get("/metrics")).text()
    return {family(line.split()[2]) for line in text.splitlines() if line.startswith("# TYPE ")}


@pytest.mark.parametrize(
    "artefact", ["deploy/grafana/dashboard.json", "deploy/prometheus/alerts.yml"]
)
async def test_every_metric_a_dashboard_or_alert_uses_exists(
    gateway: RunningGateway, upstream: CountingUpstream, artefact: str
) -> None:
    """Each metric named in the dashboard and alert rules is exposed by /metrics."""
    names = referenced_metrics(ROOT / artefact)
    assert names, f"{artefact} references no gateway metric"
    families = await exposed_families(gateway)
    missing = sorted(name for name in names if family(name) not in families)
    assert not missing, f"{artefact} references metrics the gateway does not expose: {missing}"
    assert upstream.count == 1


def test_dashboard_is_valid_grafana_json() -> None:
    """The dashboard parses and every panel has a query."""
    dashboard = json.loads((ROOT / "deploy/grafana/dashboard.json").read_text())
    assert dashboard["uid"] == "idempotency-gateway"
    assert all(panel["targets"] and panel["targets"][0]["expr"] for panel in dashboard["panels"])


def test_alert_rules_have_runbooks_in_the_operations_doc() -> None:
    """Every alert links a runbook section that docs/operations.md really has."""
    rules = (ROOT / "deploy/prometheus/alerts.yml").read_text()
    anchors = re.findall(r"docs/operations\.md#([a-z-]+)", rules)
    assert len(anchors) == rules.count("- alert:")
    headings = {
        re.sub(r"[^a-z0-9 -]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in (ROOT / "docs/operations.md").read_text().splitlines()
        if line.startswith("#")
    }
    assert set(anchors) <= headings


def test_dockerfile_passes_hadolint() -> None:
    """The Dockerfile has no hadolint findings (no engine runs here, so lint is the check)."""
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    result = subprocess.run(
        [hadolint, "--no-color", str(ROOT / "Dockerfile")], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
async def test_sigterm_lets_a_slow_call_finish_and_record_its_receipt(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """SIGTERM during a slow upstream call: the caller gets its answer and the receipt stays."""
    gateway = spawn(processes, tmp_path, upstream.url)
    assert gateway.process is not None
    async with aiohttp.ClientSession() as session:
        call = asyncio.ensure_future(
            session.post(
                gateway.url + "/tickets/v1/issues?delay=1",
                data=b"{}",
                headers={"Idempotency-Key": "drain", "Content-Type": "application/json"},
            )
        )
        await upstream.wait_for_count(1)
        gateway.process.send_signal(signal.SIGTERM)
        response = await call
        assert response.status == 201
        await response.read()
    assert await asyncio.to_thread(gateway.process.wait, 30) == 0

    restarted = spawn(processes, tmp_path, upstream.url)
    async with aiohttp.ClientSession() as session:
        retry = await session.post(
            restarted.url + "/tickets/v1/issues?delay=1",
            data=b"{}",
            headers={"Idempotency-Key": "drain", "Content-Type": "application/json"},
        )
        assert retry.headers["Idempotent-Replayed"] == "true"
    assert upstream.count == 1
