"""Deployment artefacts stay true: dashboards and alerts name real metrics, the image lints
and carries no routes, compose publishes the admin listener on the host's loopback only and
mounts the demo config, and SIGTERM drains in-flight calls."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import signal
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlsplit

import aiohttp
import pytest
import yaml
from harness import GatewayProcess, RunningGateway, spawn
from upstream import CountingUpstream

from gateway.config import Settings, load_settings

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


class Published(NamedTuple):
    """One `ports:` entry: the host address (None: every address), host port, container port."""

    address: str | None
    host: int
    container: int


def published() -> dict[str, list[Published]]:
    """What each service publishes, in the short syntax compose.yaml uses
    (`HOST:CONTAINER` or `ADDRESS:HOST:CONTAINER`)."""
    found: dict[str, list[Published]] = {}
    for name, service in services().items():
        for entry in service.get("ports", []):
            parts = str(entry).split(":")
            assert len(parts) in (2, 3), f"{name}: unexpected ports entry {entry!r}"
            address = parts[0] if len(parts) == 3 else None
            found.setdefault(name, []).append(Published(address, int(parts[-2]), int(parts[-1])))
    return found


def published_ports() -> dict[str, list[tuple[int, int]]]:
    """(host port, container port) pairs each service publishes."""
    return {
        name: [(entry.host, entry.container) for entry in entries]
        for name, entries in published().items()
    }


def dockerfile_text() -> str:
    """The Dockerfile with its line continuations joined."""
    return (ROOT / "Dockerfile").read_text().replace("\\\n", " ")


def dockerfile_config_path() -> str:
    """Where the image looks for its config (its IDEMPOTENCY_GATEWAY_CONFIG)."""
    match = re.search(r"\bIDEMPOTENCY_GATEWAY_CONFIG=(\S+)", dockerfile_text())
    assert match is not None, "the Dockerfile sets no IDEMPOTENCY_GATEWAY_CONFIG"
    return match[1]


GATEWAYS = ("gateway-1", "gateway-2")
A_TOKEN = "Zq4-7hL2pW9xR1vT8mK3nB6c-test-only"
"""Stands in for compose's `${ADMIN_TOKEN:?...}`, which the shell fills in."""


def mounted_config(name: str) -> tuple[Path, str]:
    """The config file a gateway service mounts at the image's config path, and its mode."""
    target = dockerfile_config_path()
    for volume in services()[name].get("volumes", []):
        source, _, rest = str(volume).partition(":")
        mounted, _, mode = rest.partition(":")
        if mounted == target:
            return (ROOT / "deploy" / source).resolve(), mode
    raise AssertionError(f"{name} mounts nothing at {target}, where the image reads its config")


def effective_settings(name: str) -> Settings:
    """A gateway service's configuration as it starts: the mounted file, overridden by the
    service's environment (compose's own `${...}` interpolations filled in), routes required
    as `serve` requires them."""
    path, _ = mounted_config(name)
    environment = {
        key: A_TOKEN if str(value).startswith("${") else str(value)
        for key, value in services()[name].get("environment", {}).items()
    }
    return load_settings(path, environ=environment, require_routes=True)


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
    for name in GATEWAYS:
        gateway = services()[name]
        assert gateway["depends_on"]["tool-api"]["condition"] == "service_healthy"
        for route in effective_settings(name).routes:
            upstream = urlsplit(route.upstream)
            assert (upstream.hostname, upstream.port) == ("tool-api", int(port[1])), route


def test_the_gateways_publish_the_port_the_image_checks() -> None:
    """Each gateway publishes its container's main port, the one the image's HEALTHCHECK asks
    and its config serves on."""
    for name in GATEWAYS:
        main = [entry for entry in published()[name] if entry.container != 8081]
        (entry,) = main
        assert entry.container == dockerfile_healthcheck_port() == 8080
        assert effective_settings(name).server.port == entry.container


def test_the_admin_listener_is_published_on_the_hosts_loopback_only() -> None:
    """Each gateway's admin listener (admin API and console) is reachable from the host, on
    127.0.0.1 only: inside the container it binds every address (a published port reaches
    nothing bound to the container's loopback), and its one published entry names the host's
    loopback. gateway-1's is where the README sends the operator: 127.0.0.1:8081/admin/."""
    hosts: dict[str, int] = {}
    for name in GATEWAYS:
        admin = effective_settings(name).admin
        assert admin.enabled
        assert admin.host in ("0.0.0.0", "::"), admin.host
        entries = [entry for entry in published()[name] if entry.container == admin.port]
        assert len(entries) == 1, (name, entries)
        assert entries[0].address == "127.0.0.1", (name, entries[0])
        hosts[name] = entries[0].host
    assert hosts == {"gateway-1": 8081, "gateway-2": 8083}
    readme = (ROOT / "README.md").read_text()
    assert f"http://127.0.0.1:{hosts['gateway-1']}/admin/" in readme


def test_the_image_carries_no_routes() -> None:
    """Nothing the Dockerfile copies from the checkout is a config with routes (the image
    once baked in config/gateway.toml, the demo's routes to 127.0.0.1): the routes come from
    the config a deployment mounts."""
    sources: list[Path] = []
    for line in dockerfile_text().splitlines():
        words = line.split()
        if not words or words[0].upper() not in ("COPY", "ADD"):
            continue
        if any(word.startswith("--from") for word in words):
            continue
        paths = [word for word in words[1:] if not word.startswith("--")]
        sources += [ROOT / path for path in paths[:-1]]
    assert sources, "the Dockerfile copies nothing from the checkout?"
    for source in sources:
        assert source.resolve() != (ROOT / "config" / "gateway.toml").resolve(), source
        files = sorted(source.rglob("*.toml")) if source.is_dir() else [source]
        for file in files:
            if file.suffix == ".toml":
                data = tomllib.loads(file.read_text())
                assert "routes" not in data, f"the image would carry {file}'s routes"


def test_compose_mounts_the_demo_config_read_only() -> None:
    """Both gateways mount the one demo config, read-only, where the image reads its config;
    it loads with the gateway's own loader and has routes (`serve` refuses a config without)."""
    mounts = {name: mounted_config(name) for name in GATEWAYS}
    assert {path for path, _ in mounts.values()} == {ROOT / "deploy" / "gateway.demo.toml"}
    assert {mode for _, mode in mounts.values()} == {"ro"}
    for name in GATEWAYS:
        assert effective_settings(name).routes


def compose_paragraphs(path: str) -> list[str]:
    """The paragraphs of a doc that talk about the compose file."""
    text = (ROOT / path).read_text()
    return [p for p in re.split(r"\n\s*\n", text) if "compose" in p.lower()]


def test_the_docs_name_the_ports_compose_publishes() -> None:
    """docs/deploy.md lists every port compose publishes, by service; the compose paragraphs
    of the README and docs/operations.md name only ports compose publishes, gateway-1's at
    least (the first-hour report: the README said :8080, compose published :8081)."""
    ports = {(name, host) for name, pairs in published_ports().items() for host, _ in pairs}
    rows = re.findall(
        r"^\|\s*`?([a-z0-9-]+)`?\s*\|\s*http://(?:localhost|127\.0\.0\.1):(\d+)\S*\s*\|",
        (ROOT / "docs/deploy.md").read_text(),
        flags=re.MULTILINE,
    )
    table = {(name, int(port)) for name, port in rows}
    assert table == ports
    hosts = {host for _, host in ports}
    for doc in ("README.md", "docs/operations.md"):
        mentioned = {int(port) for p in compose_paragraphs(doc) for port in PUBLISHED.findall(p)}
        assert published_ports()["gateway-1"][0][0] in mentioned, doc
        assert mentioned <= hosts, (doc, mentioned, ports)
