"""The journal lock (`<journal>.lock`) that Python and Node journal writers share.

The lock is a `{"host", "pid", "nonce", "at"}` record hard-linked into place
(`clients/python/idempotency_gateway_client/_lock_file.py`, and
`clients/typescript/src/lock-file.ts` for Node). These tests pin what the
protocol promises: a grant leaves nothing behind; a lock whose holder is a dead
process of this host, or that holds no record (client 0.1's empty `flock`
file), is broken at once; a live holder of this host and any holder of another
host are waited for, then refused with `JournalError` naming them; Python and
Node processes exclude each other; and `FileJournal` keeps its read-check-write
whole under it. `clients/typescript/test/lock.test.mjs` pins the same cases for
the Node client.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from idempotency_gateway_client import (
    FileJournal,
    JournalDocument,
    JournalError,
    RunLeased,
    RunLeaseLost,
    Worker,
)
from idempotency_gateway_client._lock_file import LockFile

ROOT = Path(__file__).resolve().parents[1]
DIST = ROOT / "clients" / "typescript" / "dist" / "index.js"
NODE = shutil.which("node")
needs_node = pytest.mark.skipif(
    NODE is None or not DIST.exists(),
    reason="needs node and the built Node client (cd clients/typescript && npx tsc -p .)",
)

SHORT = 0.3  # seconds: the timeout of an acquire that must give up
LONG = 5.0  # seconds: the timeout of an acquire that must not need it
PROMPT = 1.0  # seconds: breaking a stale lock takes well under this
SUBPROCESS_TIMEOUT = 30.0
INCREMENTS = 40

# A writer that takes the lock INCREMENTS times to add one to a counter file
# (read, ~1 ms pause, write), logging its name under the lock each time. It
# starts when the file GO appears, so that every writer contends from the start.
PY_COUNTER = """
import os, time
from pathlib import Path
from idempotency_gateway_client._lock_file import LockFile

lock = LockFile(Path(os.environ["LOCK"]), 20.0)
counter, log = Path(os.environ["COUNTER"]), Path(os.environ["LOG"])
Path(os.environ["READY"]).touch()
deadline = time.monotonic() + 20
while not Path(os.environ["GO"]).exists():
    assert time.monotonic() < deadline, "never told to go"
    time.sleep(0.001)
for _ in range(int(os.environ["N"])):
    with lock.held():
        value = int(counter.read_text())
        time.sleep(0.001)
        counter.write_text(str(value + 1))
        with log.open("a") as lines:
            lines.write(os.environ["NAME"] + "\\n")
    time.sleep(0.002)
"""

NODE_COUNTER = """
import { appendFileSync, existsSync, readFileSync, writeFileSync } from "node:fs";
import { setTimeout as sleep } from "node:timers/promises";
const { LockFile } = await import(process.env.DIST_URL);
const env = process.env;
const lock = new LockFile(env.LOCK, 20);
writeFileSync(env.READY, "");
const deadline = performance.now() + 20000;
while (!existsSync(env.GO)) {
  if (performance.now() > deadline) throw new Error("never told to go");
  await sleep(1);
}
for (let i = 0; i < Number(env.N); i++) {
  const held = await lock.acquire();
  try {
    const text = readFileSync(env.COUNTER, "utf-8");
    if (!/^[0-9]+$/.test(text)) throw new Error(`counter holds ${JSON.stringify(text)}`);
    await sleep(1);
    writeFileSync(env.COUNTER, String(Number(text) + 1));
    appendFileSync(env.LOG, env.NAME + "\\n");
  } finally {
    await lock.release(held);
  }
  await sleep(2);
}
"""

# A writer that takes the lock, says so (the file READY), and never lets it go:
# killed with SIGKILL inside its critical section.
PY_HOLDER = """
import os, time
from pathlib import Path
from idempotency_gateway_client._lock_file import LockFile

with LockFile(Path(os.environ["LOCK"]), 10.0).held():
    Path(os.environ["READY"]).touch()
    time.sleep(30)
"""

NODE_HOLDER = """
import { writeFileSync } from "node:fs";
import { setTimeout as sleep } from "node:timers/promises";
const { LockFile } = await import(process.env.DIST_URL);
await new LockFile(process.env.LOCK, 10).acquire();
writeFileSync(process.env.READY, "");
await sleep(30000);
"""


def python_command(script: str) -> list[str]:
    return [sys.executable, "-c", script]


def node_command(script: str) -> list[str]:
    assert NODE is not None
    return [NODE, "--input-type=module", "-e", script]


def child_env(**values: str) -> dict[str, str]:
    return {**os.environ, "DIST_URL": DIST.as_uri(), **values}


def wait_for(path: Path, children: list[subprocess.Popen[bytes]]) -> None:
    """Wait (bounded) until a child creates `path`; fail early if a child dies first."""
    deadline = time.monotonic() + SUBPROCESS_TIMEOUT
    while not path.exists():
        for child in children:
            if child.poll() is not None:
                _, err = child.communicate()
                pytest.fail(f"child {child.pid} exited {child.returncode} early: {err.decode()}")
        assert time.monotonic() < deadline, f"no {path.name} after {SUBPROCESS_TIMEOUT} s"
        time.sleep(0.005)


def stop(child: subprocess.Popen[bytes]) -> None:
    """Kill `child` if it still runs, and reap it (its pid then no longer exists)."""
    if child.poll() is None:
        child.kill()
    child.communicate(timeout=SUBPROCESS_TIMEOUT)


def dead_pid() -> int:
    """The pid of a process of this host that has exited and been reaped."""
    child = subprocess.Popen(["true"])
    child.wait(timeout=SUBPROCESS_TIMEOUT)
    with pytest.raises(ProcessLookupError):
        os.kill(child.pid, 0)
    return child.pid


def write_record(lock_path: Path, *, host: str, pid: int) -> str:
    """Leave a lock record as a writer would have linked it; the raw text written."""
    raw = json.dumps({"host": host, "pid": pid, "nonce": "feedfacecafebeef", "at": time.time()})
    lock_path.write_text(raw)
    return raw


def holder_of(lock_path: Path) -> dict[str, object]:
    record = json.loads(lock_path.read_text())
    assert isinstance(record, dict)
    assert set(record) == {"host", "pid", "nonce", "at"}
    return record


@pytest.fixture
def directory(tmp_path: Path) -> Path:
    """An empty directory for one journal: the lock's files and nothing else land here."""
    made = tmp_path / "journal"
    made.mkdir()
    return made


@pytest.fixture
def lock_path(directory: Path) -> Path:
    return directory / "run.json.lock"


@pytest.fixture
def live_pid() -> Iterator[int]:
    """The pid of a live process of this host (`sleep 30`), killed and reaped afterwards."""
    child = subprocess.Popen(["sleep", "30"])
    try:
        yield child.pid
    finally:
        stop(child)


def test_a_grant_leaves_nothing_behind(directory: Path, lock_path: Path) -> None:
    """While held, the only file is `.lock` with this process's record; after, none at all."""
    lock = LockFile(lock_path, LONG)
    for _ in range(3):
        with lock.held():
            assert [p.name for p in directory.iterdir()] == [lock_path.name]
            record = holder_of(lock_path)
            assert record["host"] == socket.gethostname()
            assert record["pid"] == os.getpid()
        assert list(directory.iterdir()) == []


def test_a_dead_holder_of_this_host_is_broken_at_once(directory: Path, lock_path: Path) -> None:
    """A writer killed in its section leaves its lock; its pid is gone: the next need not wait."""
    pid = dead_pid()
    stale = write_record(lock_path, host=socket.gethostname(), pid=pid)
    started = time.monotonic()
    with LockFile(lock_path, LONG).held():
        assert time.monotonic() - started < PROMPT
        assert lock_path.read_text() != stale
        assert holder_of(lock_path)["pid"] == os.getpid()
        assert [p.name for p in directory.iterdir()] == [lock_path.name]
    assert list(directory.iterdir()) == []


def test_an_empty_legacy_lock_is_broken_at_once(directory: Path, lock_path: Path) -> None:
    """Client 0.1's `flock` left an empty `.lock`: it holds no record, so it holds nothing."""
    lock_path.write_bytes(b"")
    started = time.monotonic()
    with LockFile(lock_path, LONG).held():
        assert time.monotonic() - started < PROMPT
        assert holder_of(lock_path)["pid"] == os.getpid()
    assert list(directory.iterdir()) == []


def test_a_live_holder_of_this_host_is_waited_for(
    directory: Path, lock_path: Path, live_pid: int
) -> None:
    """A live pid of this host is never judged dead: the waiter gives up naming it."""
    host = socket.gethostname()
    held = write_record(lock_path, host=host, pid=live_pid)
    started = time.monotonic()
    with (
        pytest.raises(JournalError, match=rf"\bpid {live_pid} on {re.escape(host)}\b"),
        LockFile(lock_path, SHORT).held(),
    ):
        pytest.fail("acquired a lock its live holder still holds")
    elapsed = time.monotonic() - started
    assert SHORT <= elapsed < SHORT + 2
    assert lock_path.read_text() == held
    assert [p.name for p in directory.iterdir()] == [lock_path.name]


def test_another_thread_of_this_process_is_waited_for(directory: Path, lock_path: Path) -> None:
    """Two writers of one process (threads, two `FileJournal`s) exclude each other too."""
    with LockFile(lock_path, LONG).held():
        held = lock_path.read_text()
        with (
            pytest.raises(JournalError, match=rf"\bpid {os.getpid()} on "),
            LockFile(lock_path, SHORT).held(),
        ):
            pytest.fail("acquired a lock this process already holds")
        assert lock_path.read_text() == held
    with LockFile(lock_path, LONG).held():
        pass
    assert list(directory.iterdir()) == []


def test_a_holder_on_another_host_is_waited_for(directory: Path, lock_path: Path) -> None:
    """Whether a pid of another host lives cannot be told here: even one unknown here waits."""
    pid = dead_pid()
    host = "some-other-host.invalid"
    assert host != socket.gethostname()
    held = write_record(lock_path, host=host, pid=pid)
    started = time.monotonic()
    with (
        pytest.raises(JournalError, match=rf"\bpid {pid} on {re.escape(host)}\b"),
        LockFile(lock_path, SHORT).held(),
    ):
        pytest.fail("broke the lock of a holder on another host")
    assert time.monotonic() - started >= SHORT
    assert lock_path.read_text() == held
    assert [p.name for p in directory.iterdir()] == [lock_path.name]


@needs_node
@pytest.mark.parametrize("language", ["python", "node"])
def test_a_writer_killed_in_its_section_is_waited_for_then_broken(
    directory: Path, lock_path: Path, language: str
) -> None:
    """A real holder (either client) blocks while it lives; SIGKILLed and reaped, it does not."""
    ready = directory.parent / "ready"
    command = python_command(PY_HOLDER) if language == "python" else node_command(NODE_HOLDER)
    holder = subprocess.Popen(
        command,
        env=child_env(LOCK=str(lock_path), READY=str(ready)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(ready, [holder])
        assert holder_of(lock_path)["pid"] == holder.pid
        with (
            pytest.raises(JournalError, match=rf"\bpid {holder.pid} on "),
            LockFile(lock_path, SHORT).held(),
        ):
            pytest.fail(f"acquired the lock of a live {language} holder")
    finally:
        stop(holder)
    assert holder.returncode == -9
    started = time.monotonic()
    with LockFile(lock_path, LONG).held():
        assert time.monotonic() - started < PROMPT
        assert holder_of(lock_path)["pid"] == os.getpid()
    assert list(directory.iterdir()) == []


@needs_node
def test_python_and_node_processes_exclude_each_other(directory: Path, lock_path: Path) -> None:
    """Concurrent read-modify-writes from both clients under the lock lose no increment."""
    counter, log, go = (
        directory.parent / "counter",
        directory.parent / "log",
        directory.parent / "go",
    )
    counter.write_text("0")
    log.write_text("")
    commands = {"py": python_command(PY_COUNTER), "node": node_command(NODE_COUNTER)}
    children: list[subprocess.Popen[bytes]] = []
    try:
        for name, command in commands.items():
            env = child_env(
                LOCK=str(lock_path),
                COUNTER=str(counter),
                LOG=str(log),
                GO=str(go),
                READY=str(directory.parent / f"ready-{name}"),
                N=str(INCREMENTS),
                NAME=name,
            )
            children.append(
                subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            )
        for name in commands:
            wait_for(directory.parent / f"ready-{name}", children)
        go.touch()
        for child in children:
            _, err = child.communicate(timeout=SUBPROCESS_TIMEOUT)
            assert child.returncode == 0, err.decode()
    finally:
        for child in children:
            stop(child)
    assert counter.read_text() == str(2 * INCREMENTS)
    order = log.read_text().split()
    assert sorted(order) == ["node"] * INCREMENTS + ["py"] * INCREMENTS
    switches = sum(1 for a, b in itertools.pairwise(order) if a != b)
    assert switches >= 2, f"the writers never interleaved: {order}"
    assert list(directory.iterdir()) == []


def test_concurrent_writes_through_two_file_journals_keep_the_json_whole(tmp_path: Path) -> None:
    """Two `FileJournal`s on one file, two writer threads: every write passes, the JSON parses."""
    path = tmp_path / "journal" / "run.json"
    journals = [FileJournal(path, lock_timeout=LONG), FileJournal(path, lock_timeout=LONG)]
    document = journals[0].acquire("run-1", "v1", Worker.current("w1"), duration=60)
    assert document.lease is not None
    outcomes: list[str] = []
    failures: list[BaseException] = []
    done = threading.Event()

    def write(journal: FileJournal) -> None:
        try:
            for _ in range(20):
                try:
                    journal.write(document, duration=60)
                    outcomes.append("ok")
                except RunLeaseLost:
                    outcomes.append("lost")
        except BaseException as exc:
            failures.append(exc)

    def read() -> None:
        try:
            while not done.is_set():
                json.loads(path.read_bytes())
                assert journals[1].read() is not None
        except BaseException as exc:
            failures.append(exc)

    reader = threading.Thread(target=read)
    writers = [threading.Thread(target=write, args=(journal,)) for journal in journals]
    reader.start()
    for thread in writers:
        thread.start()
    for thread in writers:
        thread.join(SUBPROCESS_TIMEOUT)
    done.set()
    reader.join(SUBPROCESS_TIMEOUT)
    assert not failures, failures
    # Nobody else took the run, so every write passed the fence.
    assert outcomes == ["ok"] * 40
    stored = journals[0].read()
    assert stored is not None
    assert stored.lease is not None
    assert (stored.lease.holder, stored.lease.token) == ("w1", document.lease.token)
    assert [p.name for p in path.parent.iterdir()] == [path.name]


def test_a_takeover_is_never_overwritten_by_the_old_holder(tmp_path: Path) -> None:
    """The fence and the write are one critical section: once a new worker holds the run,
    no write of the old one lands, even one that started before the takeover."""
    path = tmp_path / "journal" / "run.json"
    old_journal, new_journal = FileJournal(path, lock_timeout=LONG), FileJournal(path)
    old = old_journal.acquire("run-1", "v1", Worker.current("old"), duration=60)
    assert old.lease is not None
    took_over = threading.Event()
    outcomes: list[tuple[bool, str]] = []
    failures: list[BaseException] = []

    def old_writer() -> None:
        try:
            for _ in range(400):
                after = took_over.is_set()
                try:
                    old_journal.write(old, duration=60)
                    outcomes.append((after, "ok"))
                except RunLeaseLost:
                    outcomes.append((after, "lost"))
                if sum(1 for seen, _ in outcomes if seen) >= 10:
                    return
                time.sleep(0.001)
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=old_writer)
    thread.start()
    try:
        deadline = time.monotonic() + SUBPROCESS_TIMEOUT
        while len(outcomes) < 3 and thread.is_alive():
            assert time.monotonic() < deadline
            time.sleep(0.001)
        new: JournalDocument | None = None
        for _ in range(200):
            # The old lease ends (as when its worker lets go); the old writer may renew it
            # again before the new worker asks, so ask until the run is free.
            new_journal.release(old)
            try:
                new = new_journal.acquire("run-1", "v1", Worker.current("new"), duration=60)
                break
            except RunLeased:
                continue
        assert new is not None, "the run was never free"
    finally:
        took_over.set()
        thread.join(SUBPROCESS_TIMEOUT)
    assert not failures, failures
    assert "ok" in {outcome for seen, outcome in outcomes if not seen}, outcomes
    after = [outcome for seen, outcome in outcomes if seen]
    assert after, outcomes
    assert set(after) == {"lost"}, outcomes
    stored = new_journal.read()
    assert stored is not None
    assert stored.lease is not None
    assert (stored.lease.holder, stored.lease.token) == ("new", old.lease.token + 1)
    assert [p.name for p in path.parent.iterdir()] == [path.name]
