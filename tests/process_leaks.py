"""A pytest plugin (tests/conftest.py loads it): the session fails if a process it started
is still running at its end, and that process is killed.

A fixture that starts a process must end it, even when its test fails or times out; a
process left behind holds ports, files and CPU that the next tests (and the next run)
need. At the end of its session each pytest process lists the processes that are still
running and are its own:

- its descendants, by the parent pid chains in /proc;
- any other process of this user whose environment carries this pytest process's
  marker (`MARKER`, set when the session starts and inherited by whatever it starts):
  an orphan whose parent was killed has left the chain (`kill -9` of a process that had
  started servers of its own), but not the marker.

One process is not a leftover: the multiprocessing resource tracker that is a direct
child of the pytest process itself. An in-process gateway that read a large MCP message
started it (`gateway.mcp.reading`); it belongs to the pytest process, serves it until it
exits and exits with it.

It gives them `GRACE_SECONDS` to finish exiting (a process being stopped when the session
ends), then kills the rest, prints each with its command line and sets the exit status
to a failure. Zombies are not running and do not count.

Under pytest-xdist every worker checks its own processes and hands the list to the
controller (`workeroutput`), which reports it with its own; by the controller's check
its workers have been shut down (xdist ends them in an earlier `pytest_sessionfinish`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from collections.abc import Generator, Iterable
from dataclasses import dataclass

import pytest

MARKER = "IDEMPOTENCY_TESTS_PROCESS_OWNER"
"""Environment variable naming the pytest process (and session) that started a process."""

GRACE_SECONDS = 10.0
"""How long processes found at the session's end get to finish exiting before they are killed."""

WORKER_OUTPUT = "processes_left_running"
"""The `workeroutput` entry in which an xdist worker hands its leftovers to the controller."""

_FROM_WORKERS = pytest.StashKey[list[str]]()


@dataclass(frozen=True)
class Leftover:
    """A process still running at the session's end."""

    pid: int
    command: str
    why: str
    """"descendant" (by parent pid) or "orphan" (by the environment marker only)."""

    def describe(self) -> str:
        return f"pid {self.pid} ({self.why}): {self.command}"


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) from /proc/<pid>/stat; None once the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read().decode(errors="replace")
    except OSError:
        return None
    # The command name (in parentheses) may hold spaces and ")"; the fields follow the last ")".
    fields = text.rsplit(")", 1)[1].split()
    return fields[0], int(fields[1])


def _processes() -> dict[int, tuple[str, int]]:
    """Every running process: pid -> (state, parent pid)."""
    table: dict[int, tuple[str, int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (found := _stat(int(entry))) is not None:
            table[int(entry)] = found
    return table


def _descendants(root: int, table: dict[int, tuple[str, int]]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, (_, parent) in table.items():
        children.setdefault(parent, []).append(pid)
    found: set[int] = set()
    pending = list(children.get(root, []))
    while pending:
        pid = pending.pop()
        if pid not in found:
            found.add(pid)
            pending.extend(children.get(pid, []))
    return found


def _carries(pid: int, marker: bytes) -> bool:
    """Whether the process is this user's and its environment holds `marker`."""
    try:
        if os.stat(f"/proc/{pid}").st_uid != os.getuid():
            return False
        with open(f"/proc/{pid}/environ", "rb") as environ:
            return marker in environ.read().split(b"\0")
    except OSError:
        return False


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            words = cmdline.read().rstrip(b"\0").split(b"\0")
    except OSError:
        return "?"
    command = " ".join(word.decode(errors="replace") for word in words)
    return command[:300] or "?"


RESOURCE_TRACKER = "multiprocessing.resource_tracker"


def find_leftovers(root: int, marker: str) -> list[Leftover]:
    """The running (not zombie) processes that `root` started, by parent chain or marker."""
    table = _processes()
    running = {pid for pid, (state, _) in table.items() if state not in ("Z", "X")}
    running -= {
        pid for pid in running if table[pid][1] == root and RESOURCE_TRACKER in _command(pid)
    }
    descendants = _descendants(root, table) & running
    needle = f"{MARKER}={marker}".encode()
    orphans = {
        pid
        for pid in running - descendants
        if pid not in (root, os.getpid()) and _carries(pid, needle)
    }
    return sorted(
        [Leftover(pid, _command(pid), "descendant") for pid in descendants]
        + [Leftover(pid, _command(pid), "orphan") for pid in orphans],
        key=lambda leftover: leftover.pid,
    )


def _still_running(pids: Iterable[int]) -> set[int]:
    return {pid for pid in pids if (found := _stat(pid)) is not None and found[0] not in "ZX"}


def end_leftovers(root: int, marker: str) -> list[Leftover]:
    """Wait up to `GRACE_SECONDS` for the leftovers to exit, then kill the rest; return those."""
    leftovers = find_leftovers(root, marker)
    deadline = time.monotonic() + GRACE_SECONDS
    while leftovers and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = _still_running(leftover.pid for leftover in leftovers)
        leftovers = [leftover for leftover in leftovers if leftover.pid in alive]
    for leftover in leftovers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(leftover.pid, signal.SIGKILL)
    for leftover in leftovers:  # reap the ones that are our own children
        with contextlib.suppress(ChildProcessError):
            os.waitpid(leftover.pid, 0)
    return leftovers


def pytest_configure(config: pytest.Config) -> None:
    os.environ[MARKER] = f"{os.getpid()}-{uuid.uuid4().hex}"
    config.stash[_FROM_WORKERS] = []


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    """pytest-xdist (controller): keep what a worker found at its session's end."""
    output = getattr(node, "workeroutput", None) or {}
    found: list[str] = output.get(WORKER_OUTPUT, [])
    if found:
        worker = (getattr(node, "workerinput", None) or {}).get("workerid", "?")
        node_config: pytest.Config = node.config  # type: ignore[attr-defined]
        node_config.stash[_FROM_WORKERS].extend(f"[{worker}] {line}" for line in found)


@pytest.hookimpl(wrapper=True)
def pytest_sessionfinish(session: pytest.Session) -> Generator[None, None, None]:
    # After every other implementation: fixtures are torn down, xdist's workers are shut down.
    # Inside xdist's worker wrapper, which sends `workeroutput` to the controller after us.
    yield
    config = session.config
    found = [leftover.describe() for leftover in end_leftovers(os.getpid(), os.environ[MARKER])]
    workeroutput = getattr(config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: the controller reports
        workeroutput[WORKER_OUTPUT] = found
        return
    found += config.stash[_FROM_WORKERS]
    if not found:
        return
    if session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    heading = f"{len(found)} process(es) the tests started were still running; killed"
    if reporter is None:
        print(heading, *found, sep="\n")
        return
    reporter.ensure_newline()
    reporter.write_sep("=", heading, red=True)
    for line in found:
        reporter.write_line(line, red=True)
