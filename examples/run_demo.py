"""`make run`: the example tools and the gateway in front of them.

The ticket API (plain HTTP, :9000) and the MCP server (Streamable HTTP,
:9100/mcp) run as child processes (they are separate services in real life);
the same MCP server on stdio is started by the gateway itself (route
`mcp-stdio`), with this venv's `python3` first on PATH;
the gateway runs in this process with the given config, exactly as
`idempotency-gateway serve` would. Ctrl-C stops all three. A tool that cannot
start (its port taken) stops the demo with one line instead of leaving the
gateway in front of whatever holds that port; every port (the tools', the
gateway's, the admin listener's) is checked first, before anything starts or
is printed.

The demo config leaves the admin token empty (a shipped token would be a
shared password), so the demo makes one per run, unless
IDEMPOTENCY_GATEWAY_ADMIN__TOKEN or the config sets one, and prints how to use
it: the README's `operations` lines then work against `make run` as typed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import NoReturn, TextIO

from gateway.config import DEFAULT_CONFIG_PATH, ENV_PREFIX, Settings, load_settings
from gateway.config.loader import config_error_message
from gateway.engine.errors import ConfigError
from gateway.web.serve import run

TOKEN_VARIABLE = f"{ENV_PREFIX}ADMIN__TOKEN"


class ToolDidNotStart(Exception):
    """A child tool server exited or said something else than where it listens."""


class _Termination:
    """SIGTERM as `SystemExit`, so that the tool servers started so far are ended too.

    Python's default for SIGTERM ends the process at once, without `finally`: until the
    gateway installed its own handler, a stop (a supervisor's, `timeout`'s, `kill`'s) left
    the ticket API holding its port, and the next `make run` refused it. While a child is
    being spawned the exit waits: raised inside `Popen`, its pid would be lost with it.
    """

    def __init__(self) -> None:
        self._spawning = False
        self._pending = False

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._spawning:
            self._pending = True
            return
        self._exit()

    @staticmethod
    def _exit() -> NoReturn:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one does not cut the cleanup
        raise SystemExit(128 + signal.SIGTERM)

    @contextlib.contextmanager
    def held_while_spawning(self) -> Iterator[None]:
        self._spawning = True
        try:
            yield
        finally:
            self._spawning = False
        if self._pending:
            self._exit()


_TERMINATION = _Termination()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default=str(DEFAULT_CONFIG_PATH))
    parser.add_argument("--tool-port", type=int, default=9000)
    parser.add_argument("--mcp-port", type=int, default=9100)
    args = parser.parse_args(argv)
    _TERMINATION.install()
    try:
        settings, made_token = _settings(args.config)
    except ConfigError as exc:
        print(f"make run: {config_error_message(exc)}", file=sys.stderr)
        return 2
    if taken := _taken_ports(settings, args.tool_port, args.mcp_port):
        # Before anything starts or is printed: no admin token for a gateway that won't run.
        print(f"make run: {taken}", file=sys.stderr)
        return 1
    try:
        with (
            _child("examples.tool_api", args.tool_port),
            _child("examples.mcp_server", args.mcp_port),
        ):
            for line in admin_hint(settings, args.config, made_token=made_token):
                print(line, flush=True)
            # The stdio route's `python3` is this one (the venv is not on PATH otherwise).
            os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
            return run(settings)
    except ToolDidNotStart as exc:
        print(f"make run: {exc}", file=sys.stderr)
        return 1


def _taken_ports(settings: Settings, tool_port: int, mcp_port: int) -> str | None:
    """Which of the demo's ports another process holds (the first found), said in words;
    None when all are free. Port 0 (the OS chooses) is never taken."""
    wanted = [
        ("the ticket API", "127.0.0.1", tool_port),
        ("the MCP server", "127.0.0.1", mcp_port),
        ("the gateway", settings.server.host, settings.server.port),
    ]
    if settings.admin.enabled:
        wanted.append(("the gateway's admin listener", settings.admin.host, settings.admin.port))
    for what, host, port in wanted:
        if port and not _free(host, port):
            return f"port {port} on {host} ({what}) is taken by another process; free it first"
    return None


def _free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def _settings(config: str) -> tuple[Settings, bool]:
    """The config's settings, with this run's admin token when it names none (and whether
    the token was made here)."""
    settings = load_settings(config, require_routes=True)
    if settings.admin.token.get_secret_value():
        return settings, False
    token = secrets.token_urlsafe(24)  # 32 characters: above the 24 the gateway asks for
    return load_settings(config, require_routes=True, overrides={"admin.token": token}), True


def admin_hint(settings: Settings, config: str, *, made_token: bool) -> list[str]:
    """Where the admin console is and the CLI line that lists operations, as typed.

    The token is printed only when this run made it: one set in the
    environment or the config is the operator's already, and stays off the
    screen.
    """
    url = _admin_url(settings)
    command = _cli_command() + " operations list"
    if Path(config) != DEFAULT_CONFIG_PATH:
        command += f" --config {shlex.quote(config)}"
    if url is None:
        command += " --url <the admin URL printed below>"
    if made_token:
        token = settings.admin.token.get_secret_value()
        where = "the token below is new each run"
        cli = f"export {TOKEN_VARIABLE}={shlex.quote(token)}; {command}"
    else:
        where = (
            f"token: ${TOKEN_VARIABLE}, already set"
            if os.environ.get(TOKEN_VARIABLE)
            else f"token: admin.token in {config}"
        )
        cli = command
    console = f"{url}/admin/" if url is not None else "/admin/ on the admin listener below"
    return [f"admin console: {console} ({where})", f"admin CLI: {cli}"]


def _admin_url(settings: Settings) -> str | None:
    host, port = settings.admin.host, settings.admin.port
    if port == 0:  # the OS picks it at start: only the "admin listening" line knows
        return None
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    elif ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


def _cli_command() -> str:
    """The CLI next to this Python (`.venv/bin/idempotency-gateway` under `make run`):
    the venv is not on PATH, so a bare `idempotency-gateway` is "command not found"."""
    script = Path(sys.executable).parent / "idempotency-gateway"
    if not script.is_file():
        return f"{shlex.quote(sys.executable)} -m gateway"
    relative = os.path.relpath(script)
    return shlex.quote(str(script) if relative.startswith("..") else relative)


@contextlib.contextmanager
def _child(module: str, port: int) -> Iterator[None]:
    process: subprocess.Popen[str] | None = None
    try:
        with _TERMINATION.held_while_spawning():  # a SIGTERM now exits here, child known
            process = subprocess.Popen(
                [sys.executable, "-m", module, "--port", str(port)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        assert process.stdout is not None
        assert process.stderr is not None
        line = process.stdout.readline().strip()
        if "listening" not in line:
            process.wait(10)
            reason = process.stderr.read().strip().splitlines()
            raise ToolDidNotStart(
                f"{module} did not start on port {port}: {reason[-1] if reason else line}"
            )
        print(line, flush=True)
        # From here on the child's output is passed on as it comes: a pipe nobody
        # reads fills up and stops the child.
        for pipe, sink in ((process.stdout, sys.stdout), (process.stderr, sys.stderr)):
            threading.Thread(target=_pass_on, args=(pipe, sink), daemon=True).start()
        yield
    finally:
        if process is not None and process.poll() is None:
            process.terminate()
            process.wait(10)


def _pass_on(pipe: TextIO, sink: TextIO) -> None:
    for text in pipe:
        sink.write(text)
        sink.flush()


if __name__ == "__main__":
    sys.exit(main())
