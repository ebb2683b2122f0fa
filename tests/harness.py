"""Start the real gateway for tests: in-process on loopback, or as a subprocess.

In-process gateways are `create_app(settings)` behind a real `TCPSite` on
127.0.0.1 port 0, talked to over real HTTP. Subprocess gateways run
`python -m gateway serve` exactly as in production, for tests that `kill -9`
or SIGSTOP them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import aiohttp
import pytest
from aiohttp import web

from gateway.config import Settings, render_effective
from gateway.web.app import create_app
from gateway.web.serve import make_runner, start_sites

if TYPE_CHECKING:
    from upstream import CountingUpstream

ROOT = Path(__file__).resolve().parent.parent

ADMIN_TOKEN = "adm1n-test-token-0123456789"
"""The admin token tests configure (long enough for the start-up check, no placeholder)."""

FAULT_ENV = "IDEMPOTENCY_GATEWAY_TESTING__FAULT"
"""Test-only fault injection (`crash_<window>`, `pause_<window>`): settable only by env."""


def settings_for(
    tmp_path: Path,
    upstream_url: str,
    *,
    route: dict[str, Any] | None = None,
    extra_routes: list[dict[str, Any]] | None = None,
    store_url: str | None = None,
    clients: list[dict[str, Any]] | None = None,
    **sections: Any,
) -> Settings:
    """Settings for one route "tickets" at /tickets in front of `upstream_url`.

    `sections` update config tables (`idempotency={...}`); `clients` is the
    top-level `[[clients]]` array. The route's timeout is generous: a test whose subject
    it is sets its own, and no other may see a 504 because a loaded machine is slow.
    """
    base_route: dict[str, Any] = {
        "name": "tickets",
        "prefix": "/tickets",
        "upstream": upstream_url,
        "timeout": "60s",
    }
    base_route.update(route or {})
    document: dict[str, Any] = {
        "server": {"host": "127.0.0.1", "port": 0},
        "store": {"url": store_url or f"sqlite:///{tmp_path / 'gateway.db'}"},
        "routes": [base_route, *(extra_routes or [])],
        "logging": {"level": "warning", "format": "text"},
        # Most tests call without credentials, as one agent would: they share one scope
        # on purpose. tests/test_shared_scope.py covers the default (401).
        "idempotency": {"shared_scope": True},
        # With a token, the admin API listens on a port of its own: one the OS picks.
        "admin": {"port": 0},
    }
    if clients is not None:
        document["clients"] = clients
    for name, values in sections.items():
        document.setdefault(name, {}).update(values)
    return Settings.model_validate(document)


def write_config(settings: Settings, path: Path) -> Path:
    """The settings as a TOML file for a subprocess gateway (secrets masked: pass them by env)."""
    path.write_text(render_effective(settings))
    return path


@dataclass
class RunningGateway:
    """An in-process gateway on loopback."""

    app: web.Application
    runner: web.AppRunner
    url: str
    session: aiohttp.ClientSession
    admin_url: str | None = None

    async def post(
        self,
        path: str,
        *,
        key: str | None = None,
        json_body: Any = None,
        data: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> aiohttp.ClientResponse:
        sent = dict(headers or {})
        if key is not None:
            sent["Idempotency-Key"] = key
        if json_body is not None:
            data = json.dumps(json_body).encode()
            sent.setdefault("Content-Type", "application/json")
        response = await self.session.post(self.url + path, data=data, headers=sent)
        await response.read()
        return response

    async def get(self, path: str, **kwargs: Any) -> aiohttp.ClientResponse:
        response = await self.session.get(self.url + path, **kwargs)
        await response.read()
        return response

    async def admin_get(self, path: str, **kwargs: Any) -> aiohttp.ClientResponse:
        """GET on the admin listener (there only with an admin token configured)."""
        assert self.admin_url is not None, "no admin listener: configure an admin token"
        response = await self.session.get(self.admin_url + path, **kwargs)
        await response.read()
        return response


async def start_gateway(settings: Settings) -> RunningGateway:
    app = create_app(settings)
    runner = make_runner(app, settings, shutdown_timeout=5)
    await runner.setup()
    urls = await start_sites(runner, settings)
    session = aiohttp.ClientSession(auto_decompress=False)
    return RunningGateway(
        app=app,
        runner=runner,
        url=urls[0],
        session=session,
        admin_url=urls[1] if len(urls) > 1 else None,
    )


async def stop_gateway(gateway: RunningGateway) -> None:
    await gateway.session.close()
    await gateway.runner.cleanup()


@dataclass
class GatewayProcess:
    """`python -m gateway serve` in a subprocess, as production runs it."""

    config_path: Path
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[str] | None = None
    url: str = ""
    admin_url: str | None = None
    expects_admin: bool = False
    """An admin token is configured: the admin listener's line follows the main one."""
    log_path: Path | None = None
    command: tuple[str, ...] = (sys.executable, "-m", "gateway")
    """How the gateway is started: this checkout's, unless a test installed one elsewhere."""
    cwd: Path = ROOT

    def start(self, wait_seconds: float = 120.0) -> None:
        """Start the process and wait for its "listening on" line (blocking: it is quick).

        `wait_seconds` bounds only a start that hangs: on a machine busy with other work,
        starting Python and the gateway can take tens of seconds.
        """
        env = {**os.environ, **self.env}
        self.log_path = self.config_path.with_suffix(".log")
        with open(self.log_path, "a") as log:
            self.process = subprocess.Popen(
                [*self.command, "serve", "--config", str(self.config_path)],
                cwd=self.cwd,
                env=env,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
            )
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], wait_seconds)
        line = self.process.stdout.readline() if ready else ""
        if "listening on" not in line:
            self.process.kill()
            self.process.wait()
            self.process.stdout.close()
            raise RuntimeError(f"gateway did not start: {line!r}\n{self.log_path.read_text()}")
        self.url = line.strip().rsplit(" ", 1)[-1]
        if self.expects_admin:
            second = self.process.stdout.readline()
            assert "admin listening on" in second, second
            self.admin_url = second.strip().rsplit(" ", 1)[-1]

    def kill(self, sig: int = signal.SIGKILL) -> None:
        assert self.process is not None
        self.process.send_signal(sig)
        if sig in (signal.SIGKILL, signal.SIGTERM):
            self.process.wait(timeout=30)

    def stop(self) -> None:
        """Terminate gracefully (resuming a stopped process first); kill after 20 s."""
        if self.process is None:
            return
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


def spawn(
    processes: list[GatewayProcess],
    tmp_path: Path,
    upstream_url: str,
    *,
    fault: str | None = None,
    name: str = "gw",
    env: dict[str, str] | None = None,
    **options: Any,
) -> GatewayProcess:
    """Start a subprocess gateway on `tmp_path`'s database; `processes` stops it after the test.

    `options` are `settings_for`'s; `fault` arms a test-only fault for this process only;
    `name` names its config and log files (`<name>.toml`, `<name>.log`), so replicas
    sharing one `tmp_path` (and one PostgreSQL store) keep their own; `env` adds to the
    process's environment (e.g. `skewed_clock(...)`).
    """
    settings = settings_for(tmp_path, upstream_url, **options)
    config = write_config(settings, tmp_path / f"{name}.toml")
    extra = {**(env or {}), **({FAULT_ENV: fault} if fault else {})}
    admin = settings.admin.enabled or bool(extra.get("IDEMPOTENCY_GATEWAY_ADMIN__TOKEN"))
    process = GatewayProcess(config_path=config, env=extra, expects_admin=admin)
    process.start()
    processes.append(process)
    return process


async def post_keyed(
    session: aiohttp.ClientSession, gateway: GatewayProcess, key: str, *, query: str = ""
) -> tuple[int, dict[str, str], bytes]:
    """POST a small JSON body to the route "tickets" of a subprocess gateway, with `key`;
    the answer read whole as (status, headers, body)."""
    async with session.post(
        f"{gateway.url}/tickets/v1/issues{query}",
        data=json.dumps({"key": key}).encode(),
        headers={"Idempotency-Key": key, "Content-Type": "application/json"},
    ) as response:
        return response.status, dict(response.headers), await response.read()


async def calibration_sample(
    session: aiohttp.ClientSession,
    base_url: str,
    *,
    path: str = "/tickets/v1/issues",
    headers: Mapping[str, str] | None = None,
) -> str:
    """Complete one operation of the kind a probe is calibrated against (by default the
    `POST /v1/issues` that `effects_probe` is declared for), in the caller's scope: a
    probe's "not found" releases only once it found such an operation. Returns its key."""
    key = f"calibration-sample-{os.urandom(6).hex()}"
    async with session.post(
        base_url + path,
        data=json.dumps({"title": key}).encode(),
        headers={**(headers or {}), "Idempotency-Key": key, "Content-Type": "application/json"},
    ) as response:
        await response.read()
        assert 200 <= response.status < 300, (response.status, await response.text())
    return key


async def effects_for_key(
    upstream: CountingUpstream,
    gateway_url: str,
    key: str,
    *,
    headers: dict[str, str] | None = None,
) -> int:
    """How many effects the upstream applied for the caller's `key`.

    The upstream never sees the caller's key: it sees the forwarded key (by
    default the operation id). So ask the gateway which operation `key` is in
    the caller's scope (`headers`), then count that operation's effects. A key
    without a record counts 0; an effect forwarded without one still shows in
    `upstream.count`, which the tests check as well.
    """
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{gateway_url}/operations/{quote(key, safe='')}", headers=headers) as found,
    ):
        if found.status == 404:
            return 0
        assert found.status == 200, await found.text()
        operation_id = (await found.json())["id"]
    return upstream.count_for(operation_id)


@dataclass(frozen=True)
class Finished:
    """An agent process that ran to its end (or was killed)."""

    returncode: int
    stdout: str
    stderr: str


async def run_agent(
    *args: str,
    pause_at: str | None = None,
    env: dict[str, str] | None = None,
    seconds: float = 120.0,
    program: str = sys.executable,
) -> Finished:
    """Run `python *args` (an agent script; `program="node"` for a Node one); with
    `pause_at`, kill -9 it as soon as it prints `PAUSED <pause_at>` (the step boundary
    it stopped at). `seconds` bounds only a hung agent: killed then, as it is on any error."""
    process = await asyncio.create_subprocess_exec(
        program,
        *args,
        *(["--pause-at", pause_at] if pause_at else []),
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    assert process.stderr is not None
    lines: list[str] = []
    try:
        async with asyncio.timeout(seconds):
            while line := (await process.stdout.readline()).decode():
                lines.append(line)
                if pause_at is not None and line.strip() == f"PAUSED {pause_at}":
                    process.send_signal(signal.SIGKILL)
            # Reaped before returning: a zombie's pid still looks alive to the next worker.
            await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    stderr = (await process.stderr.read()).decode()
    assert process.returncode is not None
    return Finished(process.returncode, "".join(lines), stderr)


def journal_agent_args(gateway_url: str, tmp_path: Path) -> list[str]:
    """The flags of the test agents (`tests/agent_script.py`, `tests/mcp_agent_script.py` and
    the Node twin): this gateway, a journal and a planner log in `tmp_path`."""
    return [
        "--gateway",
        gateway_url,
        "--journal",
        str(tmp_path / "run.json"),
        "--plan-log",
        str(tmp_path / "plans.log"),
    ]


@contextlib.asynccontextmanager
async def paused_agent(
    *args: str, pause_at: str, program: str = sys.executable, seconds: float = 120.0
) -> AsyncIterator[asyncio.subprocess.Process]:
    """An agent process (`program *args`) stopped at the step boundary `pause_at`, holding
    its run; killed and reaped when the block ends."""
    process = await asyncio.create_subprocess_exec(
        program, *args, "--pause-at", pause_at, cwd=ROOT, stdout=asyncio.subprocess.PIPE
    )
    assert process.stdout is not None
    try:
        async with asyncio.timeout(seconds):
            while not (line := await process.stdout.readline()).startswith(b"PAUSED"):
                assert line, f"the agent exited before it paused at {pause_at}"
        yield process
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()


def is_stopped(process: GatewayProcess) -> bool:
    """Whether the process is stopped by a signal (state T in /proc/<pid>/stat)."""
    assert process.process is not None
    stat = Path(f"/proc/{process.process.pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")


async def wait_until_stopped(process: GatewayProcess, *, seconds: float = 60.0) -> None:
    """Wait until the process has stopped itself with SIGSTOP (a `pause_*` fault)."""
    async with asyncio.timeout(seconds):
        while True:
            if is_stopped(process):
                return
            await asyncio.sleep(0.02)


FAKETIME_LIBRARY = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1")
"""Debian's libfaketime (package `faketime`), multithreaded flavour: `.ci/run` installs it."""


def skewed_clock(seconds: float) -> dict[str, str]:
    """Environment that sets a subprocess's wall clock `seconds` off the host's (the
    monotonic clock stays true), for replicas whose clocks disagree with the store's.

    Black-box, so it shows the gateway's behaviour whatever clock seam it has. Skips
    when libfaketime is missing, except in CI, which must have it.
    """
    return {**_faketime(), "FAKETIME": f"{seconds:+.3f}s"}


class SteppedClock:
    """A subprocess wall clock that the test steps while it runs (the monotonic clock
    stays true): libfaketime reads its offset from `path` at every clock call.

    >>> # clock = SteppedClock(tmp_path / "clock"); spawn(..., env=clock.env)
    >>> # clock.step(600.0)  # the host's clock jumps ten minutes ahead
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0.0
        self.env = {**_faketime(), "FAKETIME_TIMESTAMP_FILE": str(path)}
        self._write()

    def step(self, seconds: float) -> None:
        self.offset += seconds
        self._write()

    def _write(self) -> None:
        staged = self.path.with_suffix(".next")
        staged.write_text(f"{self.offset:+.3f}s\n")
        staged.replace(self.path)  # atomic: a clock call never reads half a line


def _faketime() -> dict[str, str]:
    """libfaketime preloaded, the monotonic clock left true; skips when it is missing,
    except in CI, which must have it."""
    if not FAKETIME_LIBRARY.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"{FAKETIME_LIBRARY} is missing: .ci/run installs the faketime package")
        pytest.skip("libfaketime is not installed (apt-get install faketime)")
    return {
        "LD_PRELOAD": str(FAKETIME_LIBRARY),
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_NO_CACHE": "1",
    }


def assert_names_the_key(headers: Mapping[str, str], document: dict[str, Any], key: str) -> None:
    """A refusal before any record still names the caller's key: the `Idempotency-Key`
    header, and the problem's `key` and lookup URL; no record, so no state."""
    assert headers["Idempotency-Key"] == key
    assert "Idempotency-Status" not in headers
    assert document["key"] == key
    assert document["operation"] == "/operations/" + quote(key, safe="")
    assert "state" not in document


RELEASE_SOON: dict[str, Any] = {"timeout": "2s", "not_applied_after": "0s"}
"""Route settings for tests whose subject is not the too-early guard: an unknown operation
may be released `not_applied` once its lease ran out and 2 s passed since its last send."""


async def resolve_when_allowed(
    session: aiohttp.ClientSession,
    url: str,
    body: Mapping[str, Any],
    *,
    headers: Mapping[str, str] | None = None,
    seconds: float = 90.0,
) -> tuple[int, Any]:
    """POST a resolve, repeated while the gateway answers `too-early` (the tool may still
    apply the last send): the wait ends when the gateway allows it, bounded by `seconds`.
    Returns the first other answer as (status, JSON)."""
    async with asyncio.timeout(seconds):
        while True:
            async with session.post(url, json=dict(body), headers=dict(headers or {})) as answer:
                document = json.loads(await answer.read() or b"null")
                early = answer.status == 409 and str(document.get("type", "")).endswith(
                    "/too-early"
                )
                if not early:
                    return answer.status, document
                wait = float(answer.headers.get("Retry-After", "1"))
            await asyncio.sleep(min(wait, 0.25))


ADMIN_ENV = {"IDEMPOTENCY_GATEWAY_ADMIN__TOKEN": ADMIN_TOKEN}
"""A subprocess gateway's admin token, given by environment (config files mask secrets)."""


async def force_release(
    session: aiohttp.ClientSession,
    gateway: GatewayProcess,
    key: str,
    *,
    note: str,
    headers: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """An operator releases `key` now, on the record (`force`), through the admin API of a
    subprocess gateway started with `ADMIN_ENV`: for tests whose subject is what follows
    a release, not the too-early guard. Returns the operation JSON."""
    assert gateway.admin_url is not None, "start the gateway with env=ADMIN_ENV"
    async with session.get(
        f"{gateway.url}/operations/{quote(key, safe='')}", headers=dict(headers or {})
    ) as found:
        operation_id = (await found.json())["id"]
    async with session.post(
        f"{gateway.admin_url}/admin/operations/{operation_id}/resolve",
        json={"outcome": "not_applied", "note": note, "force": True},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    ) as resolved:
        document: dict[str, Any] = await resolved.json()
        assert resolved.status == 200, document
        return document
