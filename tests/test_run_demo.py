"""`make run` (examples/run_demo.py) as a newcomer meets it: in a subprocess, on free ports.

From the first-hour report: the README's `operations list` line did not work
against `make run` (the admin API was off in the demo config), and a tool
port already taken must stop the demo with one line, never leave a gateway
serving in front of whatever holds that port.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest
from harness import ADMIN_TOKEN, ROOT

from gateway.config import ENV_PREFIX

pytestmark = pytest.mark.slow

START_SECONDS = 30.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def demo_env(tmp_path: Path, ports: dict[str, int], **extra: str) -> dict[str, str]:
    """The caller's environment without gateway settings, then the demo's ports and a store
    in `tmp_path` (never the checkout's data/gateway.db, which a real `make run` may hold)."""
    env = {name: value for name, value in os.environ.items() if not name.startswith(ENV_PREFIX)}
    env.update(
        {
            f"{ENV_PREFIX}SERVER__PORT": str(ports["gateway"]),
            f"{ENV_PREFIX}ADMIN__PORT": str(ports["admin"]),
            f"{ENV_PREFIX}STORE__URL": f"sqlite:///{tmp_path / 'demo.db'}",
            f"{ENV_PREFIX}ROUTES__0__UPSTREAM": f"http://127.0.0.1:{ports['tool']}",
            f"{ENV_PREFIX}ROUTES__1__UPSTREAM": f"http://127.0.0.1:{ports['mcp']}/mcp",
        }
    )
    env.update(extra)
    return env


def start_demo(
    env: dict[str, str],
    ports: dict[str, int],
    *,
    stderr: IO[str] | int = subprocess.PIPE,
    new_session: bool = False,
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "examples.run_demo",
            "--config",
            "config/gateway.toml",
            "--tool-port",
            str(ports["tool"]),
            "--mcp-port",
            str(ports["mcp"]),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        start_new_session=new_session,
    )


def lines_until(process: subprocess.Popen[str], marker: str) -> list[str]:
    """stdout lines up to the first that contains `marker` (the test fails if none comes).

    A thread reads: `select` on a text pipe misses lines already in its buffer."""
    assert process.stdout is not None
    stdout = process.stdout
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        with stdout:  # closed here, at the end of the demo's output
            for line in stdout:
                lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    seen: list[str] = []
    deadline = time.monotonic() + START_SECONDS
    while (left := deadline - time.monotonic()) > 0:
        try:
            line = lines.get(timeout=left)
        except queue.Empty:
            break
        if line is None:
            break
        seen.append(line)
        if marker in line:
            return seen
    pytest.fail(f"no line with {marker!r} from the demo; its stdout: {seen}")


@pytest.fixture
def ports() -> dict[str, int]:
    return {name: free_port() for name in ("gateway", "admin", "tool", "mcp")}


@pytest.fixture
def demos() -> Iterator[list[subprocess.Popen[str]]]:
    """Every demo a test starts is stopped as Ctrl-C would (its tool servers with it)."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)


def shell(command: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("preset", [False, True], ids=["generated-token", "token-from-env"])
def test_the_printed_admin_line_works_as_typed(
    tmp_path: Path,
    ports: dict[str, int],
    demos: list[subprocess.Popen[str]],
    preset: bool,
) -> None:
    """The demo enables the admin listener with a token (generated per run unless
    IDEMPOTENCY_GATEWAY_ADMIN__TOKEN is set), prints how to use it, and the printed CLI line,
    run in a shell from the checkout, lists operations."""
    extra = {f"{ENV_PREFIX}ADMIN__TOKEN": ADMIN_TOKEN} if preset else {}
    env = demo_env(tmp_path, ports, **extra)
    with open(tmp_path / "demo.log", "w") as log:
        demo = start_demo(env, ports, stderr=log)
    demos.append(demo)

    lines = lines_until(demo, "admin listening on")

    console = next((line for line in lines if line.startswith("admin console:")), None)
    assert console is not None, lines
    assert f"http://127.0.0.1:{ports['admin']}/admin/" in console
    cli_line = next((line for line in lines if line.startswith("admin CLI:")), None)
    assert cli_line is not None, lines
    command = cli_line.removeprefix("admin CLI:").strip()
    assert ".venv/bin/idempotency-gateway operations list" in command or (
        "idempotency-gateway operations list" in command
    )
    if preset:
        assert ADMIN_TOKEN not in "\n".join(lines)  # not echoed: the operator already has it
    else:
        token = re.search(rf"export {ENV_PREFIX}ADMIN__TOKEN=(\S+);", command)
        assert token is not None, command
        assert len(token[1]) >= 24

    # The operator's shell: the demo's port settings, but no token unless they set one.
    typed = shell(command, {**env, **extra})

    assert typed.returncode == 0, typed.stdout + typed.stderr
    assert typed.stdout.split()[:2] == ["ID", "STATE"], typed.stdout
    assert typed.stderr == ""


@pytest.mark.parametrize("which", ["tool", "mcp", "gateway", "admin"])
def test_a_taken_port_is_named_before_anything_is_printed(
    tmp_path: Path, ports: dict[str, int], demos: list[subprocess.Popen[str]], which: str
) -> None:
    """Any of the demo's ports taken: one line naming it, nothing on stdout (no console URL,
    no fresh admin token for a gateway that will not run), no tool started, no store."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", ports[which]))
        holder.listen()
        demo = start_demo(demo_env(tmp_path, ports), ports)
        demos.append(demo)
        try:
            out, err = demo.communicate(timeout=START_SECONDS)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the demo kept running with its {which} port taken")

    assert demo.returncode == 1
    assert err.strip().splitlines() == [err.strip()], err
    assert err.startswith(f"make run: port {ports[which]} on 127.0.0.1 (")
    assert out == ""
    assert not (tmp_path / "demo.db").exists()


@pytest.mark.parametrize(
    "marker",
    ["tool API listening on", "gateway listening on"],
    ids=["while-the-mcp-server-starts", "serving"],
)
def test_sigterm_ends_the_tool_servers_too(
    tmp_path: Path, ports: dict[str, int], marker: str
) -> None:
    """SIGTERM (a supervisor's stop, `timeout`, `kill`) ends the demo and the tool servers it
    started, whenever it comes. Before the gateway's own handler was installed, it ended the
    demo at once and left the ticket API holding its port: the next `make run` refused it."""
    with open(tmp_path / "demo.log", "w") as log:
        # A process group of its own: whatever the demo leaves behind is ended below.
        demo = start_demo(demo_env(tmp_path, ports), ports, stderr=log, new_session=True)
    try:
        lines_until(demo, marker)
        demo.send_signal(signal.SIGTERM)
        demo.wait(START_SECONDS)
        held = [name for name in ("tool", "mcp") if not port_is_free(ports[name])]
        assert held == [], f"the demo exited ({demo.returncode}) leaving {held} listening"
        assert demo.returncode in (0, 128 + signal.SIGTERM), demo.returncode
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(demo.pid, signal.SIGKILL)
        demo.wait()


def port_is_free(port: int) -> bool:
    """No listener on `port` (a connection's TIME_WAIT does not count, as for a new server)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
