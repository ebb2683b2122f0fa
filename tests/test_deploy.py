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
from typing import Any

import aiohttp
import pytest
import yaml
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


# -- deploy/compose.yaml, read as YAML ----------------------------------------------------------
# PyYAML comes into the dev venv through schemathesis and langchain-core (not a direct dependency).

GATEWAY_IMAGE = "idempotency-gateway:local"
PUBLISHED = re.compile(r"\b(?:localhost|127\.0\.0\.1):(\d+)\b")


def compose() -> dict[str, Any]:
    document = yaml.safe_load((ROOT / "deploy/compose.yaml").read_text())
    assert isinstance(document, dict)
    return document


def services() -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = compose()["services"]
    return found


def published_ports() -> dict[str, list[tuple[int, int]]]:
    """(host port, container port) pairs each service publishes."""
    ports: dict[str, list[tuple[int, int]]] = {}
    for name, service in services().items():
        for entry in service.get("ports", []):
            host, _, container = str(entry).rpartition(":")
            ports.setdefault(name, []).append((int(host.rpartition(":")[2]), int(container)))
    return ports


def dockerfile_healthcheck_port() -> int:
    text = (ROOT / "Dockerfile").read_text()
    match = re.search(r"HEALTHCHECK[^\n]*(?:\\\n[^\n]*)*?http://127\.0\.0\.1:(\d+)/healthz", text)
    assert match is not None, "the Dockerfile has no HEALTHCHECK on /healthz"
    return int(match[1])


def test_compose_builds_the_gateway_image_once() -> None:
    """One service builds the image (tagged idempotency-gateway:local); every other service
    that runs it names the tag instead of building the same image again."""
    builders = [name for name, service in services().items() if "build" in service]
    assert len(builders) == 1, builders
    assert services()[builders[0]]["image"] == GATEWAY_IMAGE
    users = {name for name, service in services().items() if service.get("image") == GATEWAY_IMAGE}
    assert users == {"tool-api", "gateway-1", "gateway-2"}


def test_the_tool_api_is_health_checked_on_its_own_port() -> None:
    """The tool API runs the gateway image, whose HEALTHCHECK asks :8080/healthz, where nothing
    of the tool API listens (always unhealthy): it has a check of its own, on the port it
    serves, and the gateways wait for it to pass."""
    tool = services()["tool-api"]
    command = " ".join(
        str(part) for part in [*tool.get("entrypoint", []), *tool.get("command", [])]
    )
    port = re.search(r"--port\s+(\d+)", command)
    assert port is not None, command
    test = " ".join(tool["healthcheck"]["test"])
    assert f"http://127.0.0.1:{port[1]}/" in test
    assert f":{dockerfile_healthcheck_port()}/" not in test
    for name in ("gateway-1", "gateway-2"):
        gateway = services()[name]
        assert gateway["depends_on"]["tool-api"]["condition"] == "service_healthy"
        upstream = gateway["environment"]["IDEMPOTENCY_GATEWAY_ROUTES__0__UPSTREAM"]
        assert upstream == f"http://tool-api:{port[1]}"


def test_the_gateways_publish_the_port_the_image_checks() -> None:
    """Each gateway publishes its container's main port, the one the image's HEALTHCHECK asks."""
    ports = published_ports()
    for name in ("gateway-1", "gateway-2"):
        (pair,) = ports[name]
        assert pair[1] == dockerfile_healthcheck_port() == 8080


def compose_paragraphs(path: str) -> list[str]:
    """The paragraphs of a doc that talk about the compose file."""
    text = (ROOT / path).read_text()
    return [p for p in re.split(r"\n\s*\n", text) if "compose" in p.lower()]


def test_the_docs_name_the_ports_compose_publishes() -> None:
    """docs/deploy.md lists every port compose publishes, by service; the compose paragraphs
    of the README and docs/operations.md name only ports compose publishes, gateway-1's at
    least (the first-hour report: the README said :8080, compose published :8081)."""
    ports = {name: pairs[0][0] for name, pairs in published_ports().items()}
    rows = re.findall(
        r"^\|\s*`?([a-z0-9-]+)`?\s*\|\s*http://localhost:(\d+)\S*\s*\|",
        (ROOT / "docs/deploy.md").read_text(),
        flags=re.MULTILINE,
    )
    table = {name: int(port) for name, port in rows}
    assert table == ports
    for doc in ("README.md", "docs/operations.md"):
        mentioned = {int(port) for p in compose_paragraphs(doc) for port in PUBLISHED.findall(p)}
        assert ports["gateway-1"] in mentioned, doc
        assert mentioned <= set(ports.values()), (doc, mentioned, ports)
