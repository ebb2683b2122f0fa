"""Servers under test as child processes: started on loopback port 0, always stopped.

Each server runs in its own process so that its CPU time can be read from
/proc without the load generator's, and so that the gateway runs exactly as
production runs it (`python -m gateway serve`). A multi-process server (a
gateway with `workers` above 1, `bench.plain_proxy --processes`) is a
supervisor with worker children: `pid` is the supervisor's, whose SIGTERM
stops them all, and its CPU is read over the tree (`LoadSpec.cpu_tree`). Every server prints one
"... listening on http://HOST:PORT" line once it accepts connections; that
line is the only way to learn the port the OS chose.
"""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

__all__ = ["ROOT", "ServerProcess", "gateway", "mcp_server", "plain_proxy", "tool_api"]

ROOT = Path(__file__).resolve().parent.parent
_STOP_GRACE = 20.0
"""Seconds a server gets to drain after SIGTERM before it is killed."""
_START_TIMEOUT = 120.0
"""Seconds a server may take to print its "listening on" line: only a hung start takes this
long, but a machine busy with other work can take tens of seconds to start Python."""


class ServerProcess:
    """One server subprocess; `with` starts it and guarantees it is gone afterwards.

    >>> # with tool_api(log_dir) as api:
    >>> #     print(api.url, api.pid)
    """

    def __init__(
        self,
        name: str,
        argv: list[str],
        *,
        log_path: Path,
        start_timeout: float = _START_TIMEOUT,
        env: Mapping[str, str] | None = None,
        cwd: Path = ROOT,
        admin: bool = False,
    ) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self.start_timeout = start_timeout
        self.env = dict(env) if env is not None else None
        """Variables added to (or replacing) this process's inherited environment."""
        self.cwd = cwd
        self.url = ""
        self.admin = admin
        self.admin_url: str | None = None
        """With `admin`, the admin listener's URL, which the server prints after its own."""
        self._process: subprocess.Popen[str] | None = None

    @property
    def pid(self) -> int:
        if self._process is None:
            raise RuntimeError(f"{self.name} is not running")
        return self._process.pid

    def start(self) -> ServerProcess:
        """Start the process; return once its "listening on" line names the URL."""
        # stderr goes to a file, never a pipe: a pipe nobody reads fills up and
        # blocks the server mid-benchmark (the info-level access log is large).
        with open(self.log_path, "a") as log:
            self._process = subprocess.Popen(
                self.argv,
                cwd=self.cwd,
                env={**os.environ, **self.env} if self.env is not None else None,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
            )
        assert self._process.stdout is not None
        ready, _, _ = select.select([self._process.stdout], [], [], self.start_timeout)
        line = self._process.stdout.readline() if ready else ""
        if "listening on http://" not in line:
            self.stop()
            raise RuntimeError(
                f"{self.name} did not start: {line!r}\n{self.log_path.read_text()[-2000:]}"
            )
        self.url = line.strip().rsplit(" ", 1)[-1]
        if self.admin:
            # A gateway with an admin token prints that listener's line right after the
            # first (or exits: then EOF). Not `select`: the line may already be buffered.
            following = self._process.stdout.readline()
            if "admin listening on http://" not in following:
                self.stop()
                raise RuntimeError(f"{self.name} printed no admin listener: {following!r}")
            self.admin_url = following.strip().rsplit(" ", 1)[-1]
        return self

    def stop(self) -> None:
        """SIGTERM, wait for the drain, then SIGKILL if it is still there."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(_STOP_GRACE)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stdout is not None:
            with contextlib.suppress(OSError):
                process.stdout.close()

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def tool_api(log_dir: Path) -> ServerProcess:
    """The example tool API: the upstream every row ends at."""
    argv = [sys.executable, "-m", "examples.tool_api", "--host", "127.0.0.1", "--port", "0"]
    return ServerProcess("tool API", argv, log_path=log_dir / "tool_api.log")


def plain_proxy(log_dir: Path, upstream: str, *, processes: int = 1) -> ServerProcess:
    """The baseline: a pass-through aiohttp proxy in front of `upstream`.

    `processes` above 1: a supervisor and that many children on the one port
    (`bench.plain_proxy --processes`), its `pid` the supervisor's.
    """
    argv = [sys.executable, "-m", "bench.plain_proxy", "--port", "0", "--upstream", upstream]
    name, log = "plain proxy", "plain_proxy.log"
    if processes != 1:
        argv += ["--processes", str(processes)]
        name, log = f"plain proxy ({processes} processes)", f"plain_proxy_{processes}p.log"
    return ServerProcess(name, argv, log_path=log_dir / log)


def mcp_server(log_dir: Path, *, json_response: bool) -> ServerProcess:
    """The MCP rows' upstream (`bench.mcp_server`); its `url` is the MCP endpoint (`.../mcp`)."""
    argv = [sys.executable, "-m", "bench.mcp_server", "--port", "0"]
    if json_response:
        argv.append("--json-response")
    form = "json" if json_response else "sse"
    return ServerProcess(f"MCP server ({form})", argv, log_path=log_dir / f"mcp_server_{form}.log")


def gateway(
    config_path: Path,
    *,
    name: str = "gateway",
    env: Mapping[str, str] | None = None,
    cwd: Path = ROOT,
    admin: bool = False,
) -> ServerProcess:
    """`python -m gateway serve --config FILE`, its log beside the config file
    (`admin`: the config has an admin token, so wait for that listener's URL too).

    `cwd` is where `-m gateway` is imported from (a scratch copy of the repository
    runs its own gateway code); `env` is added to the inherited environment."""
    argv = [sys.executable, "-m", "gateway", "serve", "--config", str(config_path)]
    return ServerProcess(
        name, argv, log_path=config_path.with_suffix(".log"), env=env, cwd=cwd, admin=admin
    )
