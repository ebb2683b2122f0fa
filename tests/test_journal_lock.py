"""The journal lock that Python and Node journal writers share: generations `.<journal>.lock.<n>`.

Each generation is a `{"host", "pid", "nonce", "at"}` record hard-linked into place from a staging
file `.<journal>.lock-staging.<pid>.<nonce>`, and the highest one decides: the lock is free when
there is none, when it has its marker `.<journal>.lock.<n>.released`, or when its holder is dead
(`clients/python/idempotency_gateway_client/_lock_file.py`, and
`clients/typescript/src/lock-file.ts` for Node; `docs/journal.md`). These tests pin what the
protocol promises: a release creates the marker and leaves its generation in place, so a grant
leaves exactly its generation and marker behind and the next grant is `n + 1`, removing `n` and its
marker; generation numbers only grow, one per grant. A dead holder (a gone process of this host, a
file that holds no record) is succeeded at once by the next generation, its file removed only after
that generation exists. A live holder of this host, any record of this very process (another
thread, a second copy of the module, an orphan) and any holder of another host are waited for, then
refused with a `JournalError` naming them and the file; a released generation is free whoever holds
it. Two writers that judge one generation free race for one link, and the loser waits; a writer
that looked long ago withdraws; a writer that judged a grant being released, or paused before its
link, never holds beside a newer grant; an error after a won link leaves that generation released;
the winner removes staging files of dead writers only, and nothing else as one; odd records are
judged the same by both languages; Python and Node processes exclude each other; `FileJournal`
keeps its read-check-write whole under it, and its lock's files hidden, in both clients. Every test
runs under `audit`: no lock file is renamed; the highest generation and its marker are never
removed; a generation is removed only by the writer that linked it (withdrawing) or by one that
holds a newer generation, a marker only by one that holds a newer generation, and only the writer
that linked a generation creates its marker; a staging file of a live process other than this one
is never removed. `clients/typescript/test/lock.test.mjs` pins the same cases for the Node client.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import importlib.util
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from idempotency_gateway_client import (
    FileJournal,
    JournalDocument,
    JournalError,
    RunLeased,
    RunLeaseLost,
    Worker,
    _lock_file,
)
from idempotency_gateway_client._lock_file import LockFile

ROOT = Path(__file__).resolve().parents[1]
TYPESCRIPT = ROOT / "clients" / "typescript"
DIST = TYPESCRIPT / "dist" / "index.js"
HOST = socket.gethostname()
OTHER_HOST = "some-other-host.invalid"
NONCE = "feedfacecafebeef"  # a nonce no grant of this process has

SHORT = 0.2  # seconds: the timeout of an acquire that must give up
LONG = 5.0  # seconds: the timeout of an acquire that must not need it
WINDOW = 0.3  # seconds: how long a writer that must wait is given to (wrongly) take the lock
SUBPROCESS_TIMEOUT = 30.0
INCREMENTS = 40
TAKEOVERS = 5
RACE_ROUNDS = 30
STRESS_WRITERS = 4
STRESS_TURNS = 300
STRESS_SECONDS = 2.5  # the in-process stress stops taking turns after this

# A writer that takes the lock INCREMENTS times to add one to a counter file
# (read, 3 ms pause, write), logging its name under the lock each time. It
# starts when the file GO appears, so that every writer contends from the start
# (for a dead holder's generation first). The pause outlasts a takeover, so a
# writer that took a live lock would lose increments.
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
        time.sleep(0.003)
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
  const grant = await lock.acquire();
  try {
    const text = readFileSync(env.COUNTER, "utf-8");
    if (!/^[0-9]+$/.test(text)) throw new Error(`counter holds ${JSON.stringify(text)}`);
    await sleep(3);
    writeFileSync(env.COUNTER, String(Number(text) + 1));
    appendFileSync(env.LOG, env.NAME + "\\n");
  } finally {
    await lock.release(grant);
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

# A writer that takes the lock, says so (READY), releases it when the file GO
# appears, and exits: once reaped, its pid is dead and its record judged so.
PY_RELEASER = """
import os, time
from pathlib import Path
from idempotency_gateway_client._lock_file import LockFile

with LockFile(Path(os.environ["LOCK"]), 10.0).held():
    Path(os.environ["READY"]).touch()
    deadline = time.monotonic() + 20
    while not Path(os.environ["GO"]).exists():
        assert time.monotonic() < deadline, "never told to go"
        time.sleep(0.001)
"""

# The Node client's judgment of each lock in CASES (one acquire each, at once):
# {"verdict": "dead", "generation", "generations"} when it took the lock over,
# {"verdict": "waited", "message"} when it gave up with a JournalError.
NODE_JUDGE = """
const { LockFile, JournalError } = await import(process.env.DIST_URL);
const results = {};
await Promise.all(JSON.parse(process.env.CASES).map(async ({ name, lock }) => {
  const locker = new LockFile(lock, Number(process.env.SHORT));
  const started = performance.now();
  try {
    const grant = await locker.acquire();
    const generations = await locker.generations();
    await locker.release(grant);
    results[name] = { verdict: "dead", generation: grant.generation, generations };
  } catch (error) {
    if (!(error instanceof JournalError)) throw error;
    results[name] = { verdict: "waited", message: error.message };
  }
  results[name].seconds = (performance.now() - started) / 1000;
}));
process.stdout.write(JSON.stringify(results));
"""


# --- the audit: how the lock's files may change ---------------------------------------------

GENERATION = re.compile(r"(?P<lock>.+\.lock)\.(?P<n>[1-9][0-9]*)")
MARKER = re.compile(r"(?P<lock>.+\.lock)\.(?P<n>[1-9][0-9]*)\.released")
STAGING = re.compile(r"(?P<lock>.+\.lock)-staging\.(?P<pid>[0-9]+)\.[^.]+")


def alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class Audit:
    """What the lock did to its files, seen through `os.link`, `os.unlink`, `os.open` (the
    marker), `os.rename` and `os.replace`."""

    links: list[tuple[str, bool]] = field(default_factory=list)
    """Each link to a generation: its file name, and whether it was made (False: it existed)."""
    events: list[tuple[str, str, str]] = field(default_factory=list)
    """("link" | "mark" | "unlink", file name, thread name) for generations and markers, in order
    (a link or mark once made, an unlink as it is asked for)."""
    violations: list[str] = field(default_factory=list)
    polls: list[str] = field(default_factory=list)
    """Each wait of the lock between two looks at its generations (the thread's name): a
    holder succeeded "at once" is one succeeded with none, whatever the machine's load."""
    owned: collections.defaultdict[threading.Thread, set[Path]] = field(
        default_factory=lambda: collections.defaultdict(set)
    )
    """Per thread: the generations it linked and has not unlinked."""

    def linked(self, name: str) -> list[bool]:
        return [made for linked, made in self.links if linked == name]

    def by(self, thread: str) -> list[tuple[str, str]]:
        """The thread's events; the unlinks of one cleanup sorted (their order is not pinned)."""
        events: list[tuple[str, str]] = []
        unlinks: list[tuple[str, str]] = []
        for what, name, who in self.events:
            if who != thread:
                continue
            if what == "unlink":
                unlinks.append((what, name))
            else:
                events += [*sorted(unlinks), (what, name)]
                unlinks = []
        return events + sorted(unlinks)


def _higher_exists(directory: Path, lock: str, n: int) -> bool:
    for entry in os.listdir(directory):
        match = GENERATION.fullmatch(entry)
        if match and match["lock"] == lock and int(match["n"]) > n:
            return True
    return False


@pytest.fixture(autouse=True)
def audit(monkeypatch: pytest.MonkeyPatch) -> Iterator[Audit]:
    """Every test: no lock file is renamed; the highest generation and its marker are never
    removed; a generation is removed only by the thread that linked it (withdrawal) or by one
    that holds a newer generation of that lock (succession), a marker only by the latter; a
    marker is created only by the thread that linked its generation, while that generation
    exists; a staging file of a live process other than this one is never removed."""
    seen = Audit()
    real_link, real_unlink, real_open = os.link, os.unlink, os.open
    real_rename, real_replace = os.rename, os.replace
    real_sleep = time.sleep

    def link(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        target = Path(os.fsdecode(dst))
        generation = GENERATION.fullmatch(target.name)
        try:
            real_link(src, dst, *args, **kwargs)
        except FileExistsError:
            if generation:
                seen.links.append((target.name, False))
            raise
        if generation:
            thread = threading.current_thread()
            seen.links.append((target.name, True))
            seen.events.append(("link", target.name, thread.name))
            seen.owned[thread].add(target)

    def removing(target: Path) -> None:
        match = GENERATION.fullmatch(target.name) or MARKER.fullmatch(target.name)
        if match and target.exists():
            lock, n = match["lock"], int(match["n"])
            thread = threading.current_thread()
            mine = seen.owned[thread]
            holds_newer = any(
                (other_generation := GENERATION.fullmatch(other.name))
                and other.parent == target.parent
                and other_generation["lock"] == lock
                and int(other_generation["n"]) > n
                and other.exists()
                for other in mine
            )
            if not _higher_exists(target.parent, lock, n):
                seen.violations.append(f"{target.name} was removed while {n} was the highest")
            if target in mine:
                mine.discard(target)  # a withdrawal
            elif not holds_newer:
                seen.violations.append(
                    f"{target.name} was removed by a writer that holds no newer generation"
                )
            seen.events.append(("unlink", target.name, thread.name))
        staging = STAGING.fullmatch(target.name)
        if staging and target.exists():
            pid = int(staging["pid"])
            if pid != os.getpid() and alive(pid):
                seen.violations.append(f"{target.name}, of a live process, was removed")

    def unlink(path: Any, *args: Any, **kwargs: Any) -> None:
        if not args and kwargs.get("dir_fd") is None:
            removing(Path(os.fsdecode(path)))
        real_unlink(path, *args, **kwargs)

    def open_(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        target = Path(os.fsdecode(path))
        marker = MARKER.fullmatch(target.name) if flags & os.O_CREAT else None
        if marker is None or kwargs.get("dir_fd") is not None:
            return real_open(path, flags, *args, **kwargs)
        thread = threading.current_thread()
        file = target.with_name(f"{marker['lock']}.{marker['n']}")
        problems = []
        if file not in seen.owned[thread]:
            problems.append(f"{target.name} was created by a writer that did not link {file.name}")
        if not file.exists():  # looked at before: once marked, a newer winner may remove it
            problems.append(f"{target.name} was created without its generation")
        fd = real_open(path, flags, *args, **kwargs)
        seen.violations.extend(problems)
        seen.events.append(("mark", target.name, thread.name))
        return fd

    def rename(real: Callable[..., None]) -> Callable[..., None]:
        def renamed(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
            for name in (Path(os.fsdecode(src)).name, Path(os.fsdecode(dst)).name):
                if ".lock" in name:
                    seen.violations.append(f"{src} was renamed to {dst}")
            real(src, dst, *args, **kwargs)

        return renamed

    monkeypatch.setattr(os, "link", link)
    monkeypatch.setattr(os, "unlink", unlink)
    monkeypatch.setattr(os, "remove", unlink)
    monkeypatch.setattr(os, "open", open_)
    monkeypatch.setattr(os, "rename", rename(real_rename))
    monkeypatch.setattr(os, "replace", rename(real_replace))

    def sleep(seconds: float) -> None:
        if sys._getframe(1).f_globals.get("__name__") == LockFile.__module__:
            seen.polls.append(threading.current_thread().name)
        real_sleep(seconds)

    monkeypatch.setattr(time, "sleep", sleep)
    yield seen
    assert not seen.violations, seen.violations


# --- helpers --------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def node(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Node, with the TypeScript client built from its current sources (one build at a time
    across pytest-xdist workers). No Node is a failure, not a skip: the lock is shared."""
    program = shutil.which("node")
    if program is None:
        pytest.fail(
            "node is not on PATH; the Node client's lock tests need Node 20+", pytrace=False
        )
    build_lock = tmp_path_factory.getbasetemp().parent / "typescript-build.lock"
    with build_lock.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        built = [TYPESCRIPT / "dist" / "index.js", TYPESCRIPT / "dist" / "lock-file.js"]
        newest_source = max(p.stat().st_mtime for p in (TYPESCRIPT / "src").glob("*.ts"))
        if not all(p.exists() and p.stat().st_mtime >= newest_source for p in built):
            steps = [["npm", "run", "--silent", "build"]]
            if not (TYPESCRIPT / "node_modules").exists():
                steps.insert(0, ["npm", "ci", "--no-audit", "--no-fund"])
            for step in steps:
                done = subprocess.run(
                    step, cwd=TYPESCRIPT, capture_output=True, text=True, timeout=300, check=False
                )
                if done.returncode != 0:
                    pytest.fail(
                        f"{' '.join(step)} failed:\n{done.stdout}{done.stderr}", pytrace=False
                    )
    return program


def python_command(script: str) -> list[str]:
    return [sys.executable, "-c", script]


def node_command(node: str, script: str) -> list[str]:
    return [node, "--input-type=module", "-e", script]


def child_env(**values: str) -> dict[str, str]:
    return {**os.environ, "DIST_URL": DIST.as_uri(), **values}


def spawn(command: list[str], **env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        command, env=child_env(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


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


@contextlib.contextmanager
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A live process of this host (`sleep 30`), killed and reaped afterwards."""
    child = subprocess.Popen(["sleep", "30"])
    try:
        yield child
    finally:
        stop(child)


@pytest.fixture
def live_pid() -> Iterator[int]:
    with sleeper() as child:
        yield child.pid


def generation(lock_path: Path, n: int) -> Path:
    return lock_path.with_name(f"{lock_path.name}.{n}")


def record(*, host: str = HOST, pid: int, nonce: str = NONCE) -> bytes:
    return json.dumps({"host": host, "pid": pid, "nonce": nonce, "at": time.time()}).encode()


def plant(lock_path: Path, n: int, raw: bytes) -> Path:
    """Leave generation `n` as a writer would have linked it (or a broken one)."""
    path = generation(lock_path, n)
    path.write_bytes(raw)
    return path


def snapshot(path: Path) -> tuple[bytes, int]:
    """The file's bytes and inode: equal later means neither rewritten nor renamed over."""
    return path.read_bytes(), path.stat().st_ino


def holder_of(path: Path) -> dict[str, Any]:
    value = json.loads(path.read_bytes())
    assert isinstance(value, dict)
    assert set(value) == {"host", "pid", "nonce", "at"}
    return value


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def lock_files(directory: Path) -> list[str]:
    """The names in `directory` but the staging files of writers still acquiring."""
    return [name for name in names(directory) if not STAGING.fullmatch(name)]


def left(n: int, *others: str, lock: str = ".run.json.lock") -> list[str]:
    """The names a directory holds after the grant of generation `n` was released: that
    generation and its marker (nothing older, no staging file), and `others`."""
    return sorted([*others, f"{lock}.{n}", f"{lock}.{n}.released"])


def last_generation(directory: Path, journal: str = "run.json") -> int:
    """The generation the last grant left: the journal, that generation and its marker, and
    nothing else (no older generation, no staging or temporary file)."""
    entries = names(directory)
    assert len(entries) == 3, entries
    n = entries[0].removeprefix(f".{journal}.lock.")
    assert n.isdigit(), entries
    assert entries == [f".{journal}.lock.{n}", f".{journal}.lock.{n}.released", journal]
    return int(n)


def mark_released(lock_path: Path, n: int) -> Path:
    """Leave the marker of generation `n`, as its holder's release would have."""
    marker = lock_path.with_name(f"{lock_path.name}.{n}.released")
    marker.write_bytes(b"")
    return marker


def module_copy() -> ModuleType:
    """A second copy of `_lock_file` (as a second install or a reloaded module would be): no
    state of it is shared with the module the tests import."""
    spec = importlib.util.spec_from_file_location("lock_file_copy", _lock_file.__file__)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.LockFile is not LockFile
    return module


def refused(lock_path: Path, file: Path, pid: int, host: str) -> float:
    """Acquire with the SHORT timeout; assert the JournalError names the holder and the file."""
    started = time.monotonic()
    with (
        pytest.raises(JournalError, match=rf"pid {pid} on {re.escape(host)}\b") as error,
        LockFile(lock_path, SHORT).held(),
    ):
        pytest.fail("acquired a lock whose holder lives")
    assert str(file) in str(error.value)
    return time.monotonic() - started


@pytest.fixture
def directory(tmp_path: Path) -> Path:
    """An empty directory for one journal: the lock's files and nothing else land here."""
    made = tmp_path / "journal"
    made.mkdir()
    return made


@pytest.fixture
def lock_path(directory: Path) -> Path:
    return directory / ".run.json.lock"


# --- grants, releases and dead holders ---------------------------------------------------------


def test_a_release_leaves_its_generation_and_marker_and_the_next_grant_is_n_plus_1(
    directory: Path, lock_path: Path, audit: Audit
) -> None:
    """While held: the journal and `.lock.n`, this grant's record. Released: its marker
    `.lock.n.released` beside it, the file itself as it was (same bytes, same inode), no staging
    file `.run.json.lock-staging.<pid>.<nonce>`. The next grant is `n + 1` and removes `n` and
    its marker, so generations only grow: 1, 2, 3, and a `FileJournal`'s three grants leave 3."""
    journal = directory / "run.json"
    journal.write_text("{}")
    lock = LockFile(lock_path, LONG)
    for n in (1, 2, 3):
        with lock.held():
            assert names(directory) == [f".run.json.lock.{n}", "run.json"]
            assert lock.generations() == [n]
            held = holder_of(generation(lock_path, n))
            assert (held["host"], held["pid"]) == (HOST, os.getpid())
            before = snapshot(generation(lock_path, n))
        assert names(directory) == left(n, "run.json")
        assert snapshot(generation(lock_path, n)) == before
        assert lock.generations() == [n]
    me = threading.current_thread().name
    assert audit.by(me) == [
        ("link", ".run.json.lock.1"),
        ("mark", ".run.json.lock.1.released"),
        ("link", ".run.json.lock.2"),
        ("unlink", ".run.json.lock.1"),
        ("unlink", ".run.json.lock.1.released"),
        ("mark", ".run.json.lock.2.released"),
        ("link", ".run.json.lock.3"),
        ("unlink", ".run.json.lock.2"),
        ("unlink", ".run.json.lock.2.released"),
        ("mark", ".run.json.lock.3.released"),
    ]
    writer = FileJournal(journal.with_name("other.json"), lock_timeout=LONG)
    document = writer.acquire("run-1", "v1", Worker.current("w1"), duration=60)
    writer.write(document, duration=60)
    writer.release(document)
    assert names(directory) == sorted(
        left(3, "run.json") + left(3, "other.json", lock=".other.json.lock")
    )


def test_after_a_release_a_waiter_takes_n_plus_1_and_only_then_removes_n(
    directory: Path, lock_path: Path, audit: Audit, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Thread H holds 1; thread W waits on it (looks again and again). H releases: the
    highest generation, 1, is still there, unchanged, with its marker beside it. W then takes 2,
    and only after linking 2 removes 1 and its marker; released, it leaves 2 and its marker."""
    holding, let_go, proceed = (threading.Event() for _ in range(3))
    failures: list[BaseException] = []
    looks = [0]
    inside: list[list[str]] = []
    waiter = LockFile(lock_path, LONG)
    real, audited_link = waiter.generations, os.link

    def generations() -> list[int]:
        looks[0] += 1
        return real()

    def link(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        if threading.current_thread().name == "W":
            proceed.wait(LONG)  # the test looks at the files first
        audited_link(src, dst, *args, **kwargs)

    monkeypatch.setattr(waiter, "generations", generations)
    monkeypatch.setattr(os, "link", link)

    def h() -> None:
        try:
            with LockFile(lock_path, LONG).held():
                holding.set()
                let_go.wait(SUBPROCESS_TIMEOUT)
        except BaseException as exc:
            failures.append(exc)
        finally:
            holding.set()

    def w() -> None:
        try:
            with waiter.held():
                inside.append(names(directory))
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=h, name="H"), threading.Thread(target=w, name="W")]
    threads[0].start()
    try:
        assert holding.wait(SUBPROCESS_TIMEOUT)
        before = snapshot(generation(lock_path, 1))
        threads[1].start()
        deadline = time.monotonic() + LONG
        while looks[0] < 3:
            assert time.monotonic() < deadline, "W never looked"
            time.sleep(0.001)
        assert inside == [], "W took a held lock"
        let_go.set()
        threads[0].join(SUBPROCESS_TIMEOUT)
        assert lock_files(directory) == left(1)
        assert snapshot(generation(lock_path, 1)) == before
        proceed.set()
    finally:
        let_go.set()
        proceed.set()
        for thread in threads:
            if thread.ident is not None:  # started
                thread.join(SUBPROCESS_TIMEOUT)
    assert not failures, failures
    assert inside == [[".run.json.lock.2"]]
    assert names(directory) == left(2)
    assert audit.by("H") == [("link", ".run.json.lock.1"), ("mark", ".run.json.lock.1.released")]
    assert audit.by("W") == [
        ("link", ".run.json.lock.2"),
        ("unlink", ".run.json.lock.1"),
        ("unlink", ".run.json.lock.1.released"),
        ("mark", ".run.json.lock.2.released"),
    ]


def test_a_dead_holder_at_generation_7_is_succeeded_by_generation_8(
    directory: Path, lock_path: Path, audit: Audit
) -> None:
    """A writer killed in its section left generation 7; its pid is gone. The next writer links
    8 at once, then removes 7 (never before 8 exists). Released, 8 and its marker stay; the
    next grant is 9, and removes them."""
    plant(lock_path, 7, record(pid=dead_pid()))
    lock = LockFile(lock_path, LONG)
    assert lock.generations() == [7]
    looked = len(audit.polls)
    with lock.held():
        assert len(audit.polls) == looked  # taken at the first look, no wait
        assert lock.generations() == [8]
        assert holder_of(generation(lock_path, 8))["pid"] == os.getpid()
        assert names(directory) == [".run.json.lock.8"]
    assert audit.links == [(".run.json.lock.8", True)]
    assert [what for what, _, _ in audit.events] == ["link", "unlink", "mark"]
    assert names(directory) == left(8)
    with lock.held():
        assert names(directory) == [".run.json.lock.9"]
    assert names(directory) == left(9)


@pytest.mark.parametrize("language", ["python", "node"])
def test_a_writer_killed_in_its_section_is_waited_for_then_succeeded(
    request: pytest.FixtureRequest, directory: Path, lock_path: Path, audit: Audit, language: str
) -> None:
    """A real holder (either client) blocks while it lives, and its file stays as it is;
    SIGKILLed and reaped, it is succeeded at once by generation 2, which leaves only itself
    and its marker."""
    ready = directory.parent / "ready"
    if language == "python":
        command = python_command(PY_HOLDER)
    else:
        command = node_command(request.getfixturevalue("node"), NODE_HOLDER)
    holder = spawn(command, LOCK=str(lock_path), READY=str(ready))
    try:
        wait_for(ready, [holder])
        first = generation(lock_path, 1)
        assert names(directory) == [first.name]
        assert holder_of(first)["pid"] == holder.pid
        before = snapshot(first)
        waited = refused(lock_path, first, holder.pid, HOST)
        assert SHORT <= waited < SHORT + 60  # gives up (how soon after is the load's)
        assert snapshot(first) == before
    finally:
        stop(holder)
    assert holder.returncode == -9
    lock = LockFile(lock_path, LONG)
    looked = len(audit.polls)
    with lock.held():
        assert len(audit.polls) == looked  # taken at the first look, no wait
        assert names(directory) == [".run.json.lock.2"]
    assert names(directory) == left(2)


def test_a_live_holder_of_this_host_is_waited_for(
    directory: Path, lock_path: Path, live_pid: int
) -> None:
    """A live pid of this host is never judged dead: the waiter gives up after its timeout,
    naming the holder and the file, and leaves that file as it was, and nothing else."""
    held = plant(lock_path, 3, record(pid=live_pid))
    before = snapshot(held)
    waited = refused(lock_path, held, live_pid, HOST)
    assert SHORT <= waited < SHORT + 60  # gives up (how soon after is the load's)
    assert snapshot(held) == before
    assert names(directory) == [held.name]


def test_a_holder_on_another_host_is_waited_for(directory: Path, lock_path: Path) -> None:
    """Whether a pid of another host lives cannot be told here: even one dead here is waited
    for, and its file left as it was."""
    pid = dead_pid()
    held = plant(lock_path, 3, record(host=OTHER_HOST, pid=pid))
    before = snapshot(held)
    assert refused(lock_path, held, pid, OTHER_HOST) >= SHORT
    assert snapshot(held) == before
    assert names(directory) == [held.name]


def test_an_orphan_record_of_this_process_is_waited_for(
    directory: Path, lock_path: Path, audit: Audit
) -> None:
    """A record of this very process that no grant of the caller made (another thread's,
    another copy of the client's, or one never released) is never judged dead: waited for,
    named and left alone. Its marker frees it: the next grant is 5, at once."""
    held = plant(lock_path, 4, record(pid=os.getpid(), nonce="0123456789abcdef"))
    before = snapshot(held)
    assert refused(lock_path, held, os.getpid(), HOST) >= SHORT
    assert audit.polls, "a holder waited for shows as waits between looks"
    assert snapshot(held) == before
    assert names(directory) == [held.name]
    mark_released(lock_path, 4)
    looked = len(audit.polls)
    with LockFile(lock_path, SHORT).held():
        assert len(audit.polls) == looked  # taken at the first look, no wait
        assert names(directory) == [".run.json.lock.5"]
    assert names(directory) == left(5)


@pytest.mark.parametrize("whose", ["a live process of this host", "this process", "another host"])
def test_a_released_generation_is_free_whoever_holds_it(
    directory: Path, lock_path: Path, audit: Audit, live_pid: int, whose: str
) -> None:
    """A top generation with its `.released` marker is free, though its holder would be waited
    for without it: the next grant links 4 at once and removes 3 and its marker."""
    pid, host = {
        "a live process of this host": (live_pid, HOST),
        "this process": (os.getpid(), HOST),
        "another host": (live_pid, OTHER_HOST),
    }[whose]
    plant(lock_path, 3, record(host=host, pid=pid))
    mark_released(lock_path, 3)
    looked = len(audit.polls)
    with LockFile(lock_path, SHORT).held():
        assert len(audit.polls) == looked  # taken at the first look, no wait
        assert names(directory) == [".run.json.lock.4"]
    assert names(directory) == left(4)


@pytest.mark.parametrize("copy", [False, True], ids=["this-module", "a-second-module-copy"])
def test_another_grant_of_this_process_is_waited_for(
    directory: Path, lock_path: Path, copy: bool
) -> None:
    """A grant held by another thread of this process, through this module or a second copy
    of it (which shares no state with this one), is live: waited for, named, and left alone;
    once released, the next grant is 2."""
    holder_class = module_copy().LockFile if copy else LockFile
    holding, done = threading.Event(), threading.Event()
    failures: list[BaseException] = []

    def hold() -> None:
        try:
            with holder_class(lock_path, LONG).held():
                holding.set()
                done.wait(SUBPROCESS_TIMEOUT)
        except BaseException as exc:
            failures.append(exc)
            holding.set()

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert holding.wait(SUBPROCESS_TIMEOUT)
        held = generation(lock_path, 1)
        before = snapshot(held)
        assert refused(lock_path, held, os.getpid(), HOST) >= SHORT
        assert snapshot(held) == before
    finally:
        done.set()
        thread.join(SUBPROCESS_TIMEOUT)
    assert not failures, failures
    with LockFile(lock_path, LONG).held():
        assert names(directory) == [".run.json.lock.2"]
    assert names(directory) == left(2)


def test_files_that_are_not_generations_are_ignored(
    directory: Path, lock_path: Path, audit: Audit
) -> None:
    """The lock's own name `.<journal>.lock` (no generation), even with a live record, another
    journal's lock, `.lock.0` and `.lock.01`, a live writer's staging file: none is the lock,
    none is touched."""
    with sleeper() as live:
        others = {
            lock_path: record(pid=live.pid),
            directory / ".other.json.lock.5": record(pid=live.pid),
            directory / ".run.json.lock.0": record(pid=live.pid),
            directory / ".run.json.lock.01": record(pid=live.pid),
            directory / f".run.json.lock-staging.{live.pid}.{NONCE}": record(pid=live.pid),
        }
        for path, raw in others.items():
            path.write_bytes(raw)
        before = {path: snapshot(path) for path in others}
        lock = LockFile(lock_path, LONG)
        assert lock.generations() == []
        looked = len(audit.polls)
        with lock.held():
            assert len(audit.polls) == looked  # taken at the first look, no wait
            assert lock.generations() == [1]
        assert {path: snapshot(path) for path in others} == before
        assert names(directory) == left(1, *(path.name for path in others))


def test_the_winner_removes_staging_files_of_dead_writers_only(
    directory: Path, lock_path: Path, live_pid: int
) -> None:
    """Staging files `.run.json.lock-staging.<pid>.<nonce>` of writers that died before their
    link stay while the lock is waited for; the next writer to win a generation removes those
    whose pid is no process and that are older than any wait (ten minutes), and keeps a fresh
    one (its name has no host: a writer on another host may have that pid), those of a live
    process (this one included) and every other file (a non-ASCII digit is no pid)."""
    dead = dead_pid()
    doomed = [
        directory / f".run.json.lock-staging.{dead}.{NONCE}",
        directory / f".run.json.lock-staging.{dead}.0",
    ]
    kept = [
        directory / f".run.json.lock-staging.{dead}.fresh",
        directory / f".run.json.lock-staging.{live_pid}.{NONCE}",
        directory / f".run.json.lock-staging.{os.getpid()}.{NONCE}",
        directory / f".other.json.lock-staging.{dead}.{NONCE}",
        directory / f".run.json.lock-staging.x{dead}.{NONCE}",
        directory / ".run.json.lock-staging.\u00b2.x",  # '²' is a digit to str.isdigit, but no pid
    ]
    for path in doomed + kept:
        path.write_bytes(record(pid=dead))
    an_hour_ago = time.time() - 3600
    for path in doomed:
        os.utime(path, (an_hour_ago, an_hour_ago))
    before = {path: snapshot(path) for path in kept}
    with sleeper() as holder:
        held = plant(lock_path, 3, record(pid=holder.pid))
        refused(lock_path, held, holder.pid, HOST)
        assert all(path.exists() for path in doomed), "a waiter that never won removed files"
    with LockFile(lock_path, LONG).held():
        assert names(directory) == sorted([".run.json.lock.4", *(path.name for path in kept)])
    assert {path: snapshot(path) for path in kept} == before


def test_no_generation_or_marker_is_taken_for_a_staging_file_however_old(
    directory: Path, lock_path: Path
) -> None:
    """The staging files have a stem of their own (`-staging`), and a name of exactly one
    more part after the pid: the lock of a journal named `run.json.lock-staging.<pid>`, its
    generation and marker an hour old with that pid dead, is not this lock's staging file,
    nor is a staging file of the earlier naming (`.run.json.lock.<pid>.<nonce>`, which
    a hidden generation `.run.json.lock.<n>` would have looked like)."""
    dead = dead_pid()
    kept = [
        directory / f".run.json.lock-staging.{dead}.lock.7",
        directory / f".run.json.lock-staging.{dead}.lock.7.released",
        directory / f".run.json.lock.{dead}.{NONCE}",
    ]
    an_hour_ago = time.time() - 3600
    for path in kept:
        path.write_bytes(record(pid=dead))
        os.utime(path, (an_hour_ago, an_hour_ago))
    before = {path: snapshot(path) for path in kept}
    with LockFile(lock_path, LONG).held():
        pass
    assert {path: snapshot(path) for path in kept} == before
    assert names(directory) == sorted([*left(1), *(path.name for path in kept)])


@pytest.mark.parametrize("where", ["the-look-above-its-link", "the-cleanup"])
def test_an_error_after_a_won_link_leaves_that_generation_released(
    directory: Path, lock_path: Path, audit: Audit, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """A writer that won generation 5 fails before it holds (its second look for higher
    generations, or its removal of the older ones, raises). It never leaves a grant nobody
    holds: 5 gets its marker, the error reaches the caller, and the next writer takes 6 at
    once."""
    plant(lock_path, 4, record(pid=dead_pid()))
    lock = LockFile(lock_path, LONG)
    if where == "the-look-above-its-link":
        real, calls = lock.generations, [0]

        def generations() -> list[int]:
            calls[0] += 1
            if calls[0] == 2:
                raise OSError("injected after the link")
            return real()

        monkeypatch.setattr(lock, "generations", generations)
    else:

        def clean(older: list[int]) -> None:
            raise OSError("injected after the link")

        monkeypatch.setattr(lock, "_clean", clean)
    with pytest.raises(OSError, match="injected after the link"), lock.held():
        pytest.fail("held the lock though acquiring it failed")
    assert audit.links == [(".run.json.lock.5", True)]
    assert names(directory) == [".run.json.lock.4", *left(5)]
    looked = len(audit.polls)
    with LockFile(lock_path, SHORT).held():
        assert len(audit.polls) == looked  # taken at the first look, no wait
        assert names(directory) == [".run.json.lock.6"]
    assert names(directory) == left(6)


# --- the races --------------------------------------------------------------------------------


def race_once(lock_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """One round: two writers take the lock; the generations on disk at each grant, in grant
    order. Holding, the first holds on until the other has looked twice more. Fails on two
    holders at once."""
    looks = [0, 0]
    grants: list[list[int]] = []
    inside: list[int] = []
    failures: list[BaseException] = []
    guard = threading.Lock()
    locks = [LockFile(lock_path, 2.0), LockFile(lock_path, 2.0)]

    def counted(index: int, real: Callable[[], list[int]]) -> Callable[[], list[int]]:
        def generations() -> list[int]:
            looks[index] += 1
            return real()

        return generations

    for index, lock in enumerate(locks):
        monkeypatch.setattr(lock, "generations", counted(index, lock.generations))

    def write(index: int) -> None:
        lock = locks[index]
        try:
            with lock.held():
                with guard:
                    inside.append(index)
                    grants.append(LockFile.generations(lock))
                    first = len(grants) == 1
                assert inside == [index], f"two holders at once: {inside}"
                if first:  # hold on until the other writer has looked at least twice more
                    other, deadline = looks[1 - index], time.monotonic() + LONG
                    while looks[1 - index] < other + 2 and time.monotonic() < deadline:
                        time.sleep(0.001)
                with guard:
                    inside.remove(index)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=write, args=(index,)) for index in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(SUBPROCESS_TIMEOUT)
    assert not failures, failures
    return grants


def test_two_writers_that_judge_one_dead_generation_race_for_one_link(
    directory: Path, lock_path: Path, audit: Audit, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two writers both judge generation d dead and both link d + 1: each is held at its link
    until both got there. Exactly one link is made; the other writer finds d + 1 live (a grant
    of this process) and waits on it, never beside it, and takes d + 2 once the winner marked
    it released. Many rounds, each planting a dead generation above the last one left."""
    audited_link = os.link
    gate: list[threading.Barrier] = []
    contested = [""]
    arrivals = [0]

    def link(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        if Path(os.fsdecode(dst)).name == contested[0]:
            arrivals[0] += 1
            if arrivals[0] <= 2:
                gate[-1].wait()
        audited_link(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "link", link)
    dead = dead_pid()
    for round_ in range(RACE_ROUNDS):
        d = 5 + 3 * round_
        plant(lock_path, d, record(pid=dead))
        audit.links.clear()
        gate.append(threading.Barrier(2, timeout=2.0))
        contested[0], arrivals[0] = f".run.json.lock.{d + 1}", 0
        grants = race_once(lock_path, monkeypatch)
        assert sorted(audit.linked(contested[0])) == [False, True], (round_, audit.links)
        assert grants == [[d + 1], [d + 2]], f"round {round_}: {grants}"
        assert names(directory) == left(d + 2)


@pytest.mark.parametrize("stale_view", [[], [3]], ids=["saw-nothing", "saw-dead-3"])
def test_a_writer_that_looked_long_ago_withdraws_from_its_low_generation(
    directory: Path,
    lock_path: Path,
    audit: Audit,
    monkeypatch: pytest.MonkeyPatch,
    stale_view: list[int],
) -> None:
    """A writer whose look is old (it saw nothing, or a dead generation 3) links the next
    generation while a live holder holds 9. It wins that link, sees 9 above it, removes its own
    file, and waits on 9, naming it; 9 is never renamed or removed, 3 is left to the winner."""
    with sleeper() as live:
        plant(lock_path, 3, record(pid=dead_pid()))
        top = plant(lock_path, 9, record(pid=live.pid))
        before = snapshot(top)
        lock = LockFile(lock_path, SHORT)
        real, looks = lock.generations, [0]

        def generations() -> list[int]:
            looks[0] += 1
            return list(stale_view) if looks[0] == 1 else real()

        monkeypatch.setattr(lock, "generations", generations)
        with (
            pytest.raises(JournalError, match=rf"lock\.9 stayed locked .* pid {live.pid} on "),
            lock.held(),
        ):
            pytest.fail("held a low generation below a live holder's")
        mine = f".run.json.lock.{(stale_view or [0])[-1] + 1}"
        assert audit.links == [(mine, True)]
        assert snapshot(top) == before
        assert names(directory) == [".run.json.lock.3", ".run.json.lock.9"]
    # Its holder gone, 9 is succeeded by 10, and the older generations are cleared.
    with LockFile(lock_path, LONG).held():
        assert names(directory) == [".run.json.lock.10"]
    assert names(directory) == left(10)


def test_a_writer_paused_between_its_look_and_its_link_never_holds_beside_another(
    directory: Path, lock_path: Path, audit: Audit, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writer B judges generation 5 dead and is paused before linking 6. Meanwhile A succeeds
    5 at 6 and releases it (6 stays, marked), and C takes the free lock at 7, removing 6. When
    B links 6, C still holds: B wins 6 but sees 7 above it (no number is reused), withdraws,
    waits on C, and takes 8 once C released. Were 6 unlinked on release, C would take 1 and B
    would hold 6 beside it."""
    plant(lock_path, 5, record(pid=dead_pid()))
    audited_link, paused, resume = os.link, threading.Event(), threading.Event()
    b_holds, c_released = threading.Event(), threading.Event()
    overlap: list[bool] = []
    granted: dict[str, list[int]] = {}
    failures: list[BaseException] = []

    def link(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        if threading.current_thread().name == "B" and os.fspath(dst).endswith(".lock.6"):
            paused.set()
            resume.wait(LONG)
        audited_link(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "link", link)

    def b() -> None:
        try:
            lock = LockFile(lock_path, LONG)
            with lock.held():
                overlap.append(not c_released.is_set())
                granted["B"] = lock.generations()
                b_holds.set()
        except BaseException as exc:
            failures.append(exc)

    writer_b = threading.Thread(target=b, name="B")
    writer_b.start()
    try:
        assert paused.wait(LONG)
        a = LockFile(lock_path, LONG)
        with a.held():
            granted["A"] = a.generations()
        c = LockFile(lock_path, LONG)
        with c.held():
            granted["C"] = c.generations()
            resume.set()
            b_holds.wait(WINDOW)
            c_released.set()
    finally:
        resume.set()
        c_released.set()
        writer_b.join(SUBPROCESS_TIMEOUT)
    assert overlap == [False], f"B held the lock while C held it: {granted}"
    assert not failures, failures
    assert granted == {"A": [6], "C": [7], "B": [8]}
    assert audit.by("B")[:3] == [  # 6 was gone (C removed it): B won it, saw 7, withdrew
        ("link", ".run.json.lock.6"),
        ("unlink", ".run.json.lock.6"),
        ("link", ".run.json.lock.8"),
    ]
    assert audit.linked(".run.json.lock.6") == [True, True]  # A's, then B's after C took 7
    assert names(directory) == left(8)


@pytest.mark.parametrize("holder", ["another-process", "a-thread-of-this-process"])
def test_a_writer_that_judges_a_just_released_grant_never_holds_beside_the_next(
    directory: Path, lock_path: Path, audit: Audit, monkeypatch: pytest.MonkeyPatch, holder: str
) -> None:
    """Writer W reads generation 1, held by H, and is slow to judge it. H releases (1 stays,
    marked) and, as another process, exits; C takes the free lock at 2. W then judges H's
    record: a gone process is dead, so W links 2, which exists (no name is reused): W waits on
    C, never beside it, and takes 3 once C released. A record of this process is never dead: W
    waits on it, then on C. Were 1 unlinked on release, C would take 1 again and W, judging the
    gone H dead, would win 2 beside it."""
    real_read, read_it, resume = _lock_file._read, threading.Event(), threading.Event()
    w_holds, c_released = threading.Event(), threading.Event()
    overlap: list[bool] = []
    granted: dict[str, list[int]] = {}
    failures: list[BaseException] = []

    def read(path: Path) -> dict[str, Any]:
        found = real_read(path)
        if (
            threading.current_thread().name == "W"
            and path.name == ".run.json.lock.1"
            and not read_it.is_set()
        ):
            read_it.set()
            resume.wait(LONG)
        return found

    monkeypatch.setattr(_lock_file, "_read", read)

    def w() -> None:
        try:
            lock = LockFile(lock_path, LONG)
            with lock.held():
                overlap.append(not c_released.is_set())
                granted["W"] = lock.generations()
                w_holds.set()
        except BaseException as exc:
            failures.append(exc)

    with contextlib.ExitStack() as stack:
        let_go = threading.Event()
        if holder == "another-process":
            go, ready = directory.parent / "go", directory.parent / "ready"
            h = spawn(
                python_command(PY_RELEASER), LOCK=str(lock_path), READY=str(ready), GO=str(go)
            )
            stack.callback(stop, h)
            wait_for(ready, [h])

            def release_h() -> None:
                go.touch()
                _, err = h.communicate(timeout=SUBPROCESS_TIMEOUT)
                assert h.returncode == 0, err.decode()
                assert not alive(h.pid)

        else:
            holding = threading.Event()

            def hold() -> None:
                with LockFile(lock_path, LONG).held():
                    holding.set()
                    let_go.wait(SUBPROCESS_TIMEOUT)

            thread_h = threading.Thread(target=hold, name="H")
            thread_h.start()
            stack.callback(thread_h.join, SUBPROCESS_TIMEOUT)
            stack.callback(let_go.set)
            assert holding.wait(SUBPROCESS_TIMEOUT)

            def release_h() -> None:
                let_go.set()
                thread_h.join(SUBPROCESS_TIMEOUT)

        writer_w = threading.Thread(target=w, name="W")
        writer_w.start()
        stack.callback(writer_w.join, SUBPROCESS_TIMEOUT)
        stack.callback(c_released.set)
        stack.callback(resume.set)
        assert read_it.wait(LONG), "W never read generation 1"
        release_h()
        after_release = lock_files(directory)
        c = LockFile(lock_path, LONG)
        with c.held():
            granted["C"] = c.generations()
            resume.set()
            w_holds.wait(WINDOW)
            c_released.set()
    assert overlap == [False], f"W held the lock while C held it: {granted}"
    assert not failures, failures
    assert after_release == left(1)
    assert granted == {"C": [2], "W": [3]}
    # The gone holder was judged dead: W linked 2 after C had.
    expected = [True, False] if holder == "another-process" else [True]
    assert audit.linked(".run.json.lock.2") == expected
    assert names(directory) == left(3)


def test_a_waiter_whose_top_vanished_after_its_look_finds_the_next_taken(
    directory: Path, lock_path: Path, audit: Audit, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writer W lists the generations (1, held by H) and is paused before it reads 1. H
    releases, C takes 2 and removes 1 and its marker. W then finds 1 gone (no record: free),
    links 2, which exists, and waits on C, never beside it, then takes 3."""
    looked, resume, w_holds, c_released = (threading.Event() for _ in range(4))
    overlap: list[bool] = []
    granted: dict[str, list[int]] = {}
    failures: list[BaseException] = []
    waiter = LockFile(lock_path, LONG)
    real = waiter.generations

    def generations() -> list[int]:
        found = real()
        if not looked.is_set():
            looked.set()
            resume.wait(LONG)
        return found

    monkeypatch.setattr(waiter, "generations", generations)

    def w() -> None:
        try:
            with waiter.held():
                overlap.append(not c_released.is_set())
                granted["W"] = real()
                w_holds.set()
        except BaseException as exc:
            failures.append(exc)

    writer_w = threading.Thread(target=w, name="W")
    h = LockFile(lock_path, LONG)
    try:
        with h.held():
            writer_w.start()
            assert looked.wait(LONG)
        c = LockFile(lock_path, LONG)
        with c.held():
            granted["C"] = c.generations()
            one_is_gone = not generation(lock_path, 1).exists()
            resume.set()
            w_holds.wait(WINDOW)
            c_released.set()
    finally:
        resume.set()
        c_released.set()
        writer_w.join(SUBPROCESS_TIMEOUT)
    assert overlap == [False], f"W held the lock while C held it: {granted}"
    assert not failures, failures
    assert one_is_gone
    assert granted == {"C": [2], "W": [3]}
    assert audit.linked(".run.json.lock.2") == [True, False]
    assert names(directory) == left(3)


def test_writers_in_one_process_take_turns_one_at_a_time(directory: Path, lock_path: Path) -> None:
    """4 threads of this process take the lock up to 300 times each (for at most a few
    seconds), each turn a read-modify-write of a shared counter that yields in the middle: no
    two turns overlap, no increment is lost, every writer gets turns, and the generations are
    consecutive, one per grant: after T grants exactly `.lock.T` and its marker are left."""
    counter = [0]
    turns = [0] * STRESS_WRITERS
    inside: list[int] = []
    overlaps: list[list[int]] = []
    failures: list[BaseException] = []
    deadline = time.monotonic() + STRESS_SECONDS

    def write(index: int) -> None:
        lock = LockFile(lock_path, LONG)
        try:
            for _ in range(STRESS_TURNS):
                if time.monotonic() > deadline:
                    return
                with lock.held():
                    inside.append(index)
                    if inside != [index]:
                        overlaps.append(list(inside))
                    value = counter[0]
                    time.sleep(0)
                    counter[0] = value + 1
                    inside.remove(index)
                turns[index] += 1
                time.sleep(0.0005)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(STRESS_WRITERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(SUBPROCESS_TIMEOUT)
    assert not failures, failures
    assert not overlaps, overlaps[:5]
    assert counter[0] == sum(turns), (counter, turns)
    assert all(turns), turns
    assert names(directory) == left(sum(turns))


# --- odd lock records: judged the same by both clients -----------------------------------------


@dataclass(frozen=True)
class Pids:
    live: int
    dead: int


def _json(text: str) -> Callable[[Pids], bytes]:
    return lambda pids: (
        text.replace("LIVE", str(pids.live)).replace("DEAD", str(pids.dead)).encode()
    )


def _fields(**members: Any) -> Callable[[Pids], bytes]:
    def build(pids: Pids) -> bytes:
        value = {"host": HOST, "pid": pids.live, "nonce": NONCE, "at": 1764583200.25}
        value.update(members)
        return json.dumps({k: v for k, v in value.items() if v is not _MISSING}).encode()

    return build


_MISSING = object()
_H = json.dumps(HOST)

ODD_RECORDS: dict[str, tuple[str | None, Callable[[Pids], bytes]]] = {
    "a live pid of this host": ("waited", _fields()),
    "pid 42.0, an integer written as a float": (
        "waited",
        _json(f'{{"host": {_H}, "pid": LIVE.0, "nonce": "{NONCE}", "at": 1.5}}'),
    ),
    "another host, a pid dead here": (
        "waited",
        _json(f'{{"host": "{OTHER_HOST}", "pid": DEAD, "nonce": "{NONCE}", "at": 1.5}}'),
    ),
    "pid true": ("dead", _fields(pid=True)),
    "pid 2**40": ("dead", _fields(pid=1099511627776)),
    "pid 2**31": ("dead", _fields(pid=2**31)),
    "pid 0": ("dead", _fields(pid=0)),
    "pid -1": ("dead", _fields(pid=-1)),
    "pid 42.5": ("dead", _json(f'{{"host": {_H}, "pid": LIVE.5, "nonce": "x", "at": 1.5}}')),
    "pid a string": ("dead", lambda pids: _fields(pid=str(pids.live))(pids)),
    "not UTF-8": ("dead", lambda pids: _fields(nonce="\0")(pids).replace(b"\\u0000", b"\xff")),
    "not JSON": ("dead", _json(f'{{"host": {_H}, "pid": LIVE,')),
    "an empty file": ("dead", lambda pids: b""),
    "a JSON array": ("dead", _json(f'[{_H}, LIVE, "{NONCE}", 1.5]')),
    "no nonce": ("dead", _fields(nonce=_MISSING)),
    "host null": ("dead", _fields(host=None)),
    "at true": ("dead", _fields(at=True)),
    "at NaN": ("dead", _json(f'{{"host": {_H}, "pid": LIVE, "nonce": "{NONCE}", "at": NaN}}')),
    "at -Infinity": (
        "dead",
        _json(f'{{"host": {_H}, "pid": LIVE, "nonce": "{NONCE}", "at": -Infinity}}'),
    ),
    "at 1e999, a number too large for a double": (
        "waited",
        _json(f'{{"host": {_H}, "pid": LIVE, "nonce": "{NONCE}", "at": 1e999}}'),
    ),
    "a UTF-8 byte order mark": ("dead", lambda pids: b"\xef\xbb\xbf" + _fields()(pids)),
    "a JSON array nested 10000 deep": ("dead", lambda pids: b"[" * 10_000 + b"]" * 10_000),
}
PLANTED = 3


@pytest.fixture(scope="module")
def odd_pids() -> Iterator[Pids]:
    with sleeper() as live:
        yield Pids(live=live.pid, dead=dead_pid())


@pytest.fixture(scope="module")
def node_verdicts(
    node: str, odd_pids: Pids, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, dict[str, Any]]:
    """The Node client's verdict on every odd record, each planted in a directory of its own."""
    root = tmp_path_factory.mktemp("node-verdicts")
    cases = []
    for index, (name, (_, build)) in enumerate(ODD_RECORDS.items()):
        lock = root / str(index) / ".run.json.lock"
        lock.parent.mkdir()
        plant(lock, PLANTED, build(odd_pids))
        cases.append({"name": name, "lock": str(lock)})
    judge = spawn(node_command(node, NODE_JUDGE), CASES=json.dumps(cases), SHORT=str(SHORT))
    try:
        out, err = judge.communicate(timeout=SUBPROCESS_TIMEOUT)
    finally:
        stop(judge)
    assert judge.returncode == 0, err.decode()
    verdicts: dict[str, dict[str, Any]] = json.loads(out)
    return verdicts


def python_verdict(lock_path: Path) -> dict[str, Any]:
    lock = LockFile(lock_path, SHORT)
    started = time.monotonic()
    try:
        with lock.held():
            verdict: dict[str, Any] = {"verdict": "dead", "generations": lock.generations()}
    except JournalError as error:
        verdict = {"verdict": "waited", "message": str(error)}
    return {**verdict, "seconds": time.monotonic() - started}


@pytest.mark.parametrize("case", list(ODD_RECORDS))
def test_an_odd_lock_record_is_judged_the_same_by_both_clients(
    directory: Path,
    lock_path: Path,
    odd_pids: Pids,
    node_verdicts: dict[str, dict[str, Any]],
    case: str,
) -> None:
    """Each record as the top generation: dead (a file that holds no valid record, NaN and a
    byte-order mark included: taken over at once by the next generation, which removes it) or
    waited for (a JournalError naming the holder's pid, as an integer, its host, and the file).
    Python and Node agree on every one."""
    expected, build = ODD_RECORDS[case]
    planted = plant(lock_path, PLANTED, build(odd_pids))
    before = snapshot(planted)
    python, node = python_verdict(lock_path), node_verdicts[case]
    assert python["verdict"] == node["verdict"], (python, node)
    assert python["verdict"] == expected, python
    if expected == "dead":
        assert python["generations"] == node["generations"] == [PLANTED + 1]
        assert node["generation"] == PLANTED + 1
        # Taken over, not waited for: with a 0.2 s timeout a wait would have ended in a
        # JournalError ("waited"), so how many seconds it took says only how loaded we are.
        assert names(directory) == left(PLANTED + 1)
    else:
        holder = json.loads(before[0], parse_int=int)
        pid, host = int(holder["pid"]), holder["host"]
        for message in (python["message"], node["message"]):
            assert f".run.json.lock.{PLANTED} stayed locked" in message
            assert re.search(rf"\bpid {pid} on {re.escape(host)}\b", message), message
        assert python["seconds"] >= SHORT
        assert node["seconds"] >= SHORT
        assert snapshot(planted) == before
        assert names(directory) == [planted.name]


# --- processes and the journal ----------------------------------------------------------------


def test_python_and_node_processes_exclude_each_other(
    node: str, directory: Path, lock_path: Path
) -> None:
    """A Python and a Node writer, told to go at once, first race to succeed a dead holder's
    generation 3, then do 40 read-modify-writes each under the lock: no increment is lost,
    their turns interleave, and the 80 grants took 4 to 83, one each: 83 and its marker are
    left."""
    root = directory.parent
    counter, log, go = root / "counter", root / "log", root / "go"
    counter.write_text("0")
    log.write_text("")
    plant(lock_path, 3, record(pid=dead_pid()))
    commands = {"py": python_command(PY_COUNTER), "node": node_command(node, NODE_COUNTER)}
    children: list[subprocess.Popen[bytes]] = []
    try:
        for name, command in commands.items():
            children.append(
                spawn(
                    command,
                    LOCK=str(lock_path),
                    COUNTER=str(counter),
                    LOG=str(log),
                    GO=str(go),
                    READY=str(root / f"ready-{name}"),
                    N=str(INCREMENTS),
                    NAME=name,
                )
            )
        for name in commands:
            wait_for(root / f"ready-{name}", children)
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
    assert names(directory) == left(3 + 2 * INCREMENTS)


NODE_JOURNAL_TURN = """
const { FileJournal, currentWorker } = await import(process.env.DIST_URL);
const journal = new FileJournal(process.env.JOURNAL, { lockTimeout: 10 });
const document = await journal.acquire("run-1", "v1", currentWorker("node"), 60);
await journal.release(document);
"""


def test_a_python_and_a_node_file_journal_take_one_lock(node: str, directory: Path) -> None:
    """Both clients' `FileJournal`s name the same hidden lock for one journal: each grant,
    whichever language takes it, is the next generation of one lock, and only the journal is
    visible in its directory."""
    path = directory / "run.json"
    journal = FileJournal(path, lock_timeout=LONG)
    for turn in range(2):
        node_turn = subprocess.run(
            node_command(node, NODE_JOURNAL_TURN),
            env=child_env(JOURNAL=str(path)),
            capture_output=True,
            timeout=SUBPROCESS_TIMEOUT,
            check=False,
        )
        assert node_turn.returncode == 0, node_turn.stderr.decode()
        assert last_generation(directory) == 4 * turn + 2  # Node's acquire and release
        document = journal.acquire("run-1", "v1", Worker.current("py"), duration=60)
        journal.release(document)
        assert last_generation(directory) == 4 * turn + 4
    assert [name for name in names(directory) if not name.startswith(".")] == ["run.json"]


def test_concurrent_writes_through_two_file_journals_keep_the_json_whole(tmp_path: Path) -> None:
    """Two `FileJournal`s on one file, two writer threads: every write passes, the JSON parses,
    and the journal is left with the generation of the 41st grant (one acquire, 40 writes) and
    its marker (no older generation, no staging or temporary file)."""
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
    assert last_generation(path.parent) == 41


def test_a_takeover_is_never_overwritten_by_an_old_holder(tmp_path: Path) -> None:
    """The fence and the write are one critical section: once a new worker holds the run, no
    write of an old one lands, not even one begun before the takeover; tokens never go back."""
    path = tmp_path / "journal" / "run.json"
    taker = FileJournal(path, lock_timeout=LONG)
    current = taker.acquire("run-1", "v1", Worker.current("w0"), duration=60)
    assert current.lease is not None
    first_token = current.lease.token
    outcomes: dict[str, list[tuple[bool, str]]] = {}
    failures: list[BaseException] = []
    tokens: list[int] = []
    stopping = threading.Event()

    def write(name: str, document: JournalDocument, took_over: threading.Event) -> None:
        """Write `document` until 5 writes begun after `took_over` (or until `stopping`)."""
        journal = FileJournal(path, lock_timeout=LONG)
        mine = outcomes[name]
        try:
            for _ in range(400):
                after = took_over.is_set()
                try:
                    journal.write(document, duration=60)
                    mine.append((after, "ok"))
                except RunLeaseLost:
                    mine.append((after, "lost"))
                if stopping.is_set() or sum(1 for seen, _ in mine if seen) >= 5:
                    return
                time.sleep(0.001)
        except BaseException as exc:
            failures.append(exc)

    def read() -> None:
        journal = FileJournal(path)
        try:
            while not stopping.is_set():
                document = journal.read()
                assert document is not None
                assert document.lease is not None
                tokens.append(document.lease.token)
        except BaseException as exc:
            failures.append(exc)

    def start(name: str, document: JournalDocument) -> tuple[threading.Event, threading.Thread]:
        outcomes[name] = []
        took_over = threading.Event()
        thread = threading.Thread(target=write, args=(name, document, took_over))
        thread.start()
        return took_over, thread

    writers = [start("w0", current)]
    reader = threading.Thread(target=read)
    reader.start()
    try:
        for round_ in range(1, TAKEOVERS + 1):
            deadline = time.monotonic() + SUBPROCESS_TIMEOUT
            while len(outcomes[f"w{round_ - 1}"]) < 3 and writers[-1][1].is_alive():
                assert time.monotonic() < deadline
                time.sleep(0.001)
            taken: JournalDocument | None = None
            for _ in range(200):
                # The lease ends (as when its worker lets go); its writer may renew it
                # before the next worker asks, so ask until the run is free.
                taker.release(current)
                try:
                    taken = taker.acquire("run-1", "v1", Worker.current(f"w{round_}"), duration=60)
                    break
                except RunLeased:
                    continue
            assert taken is not None, "the run was never free"
            writers[-1][0].set()
            current = taken
            writers.append(start(f"w{round_}", current))
    finally:
        for took_over, thread in writers[:-1]:
            took_over.set()
            thread.join(SUBPROCESS_TIMEOUT)
        stopping.set()
        writers[-1][1].join(SUBPROCESS_TIMEOUT)
        reader.join(SUBPROCESS_TIMEOUT)
    assert not failures, failures
    for round_ in range(TAKEOVERS):
        seen = outcomes[f"w{round_}"]
        assert "ok" in {outcome for after, outcome in seen if not after}, seen
        after = [outcome for taken, outcome in seen if taken]
        assert after, seen
        assert set(after) == {"lost"}, f"w{round_} wrote after its run was taken: {seen}"
    assert tokens == sorted(tokens), "a fencing token went back"
    stored = taker.read()
    assert stored is not None
    assert stored.lease is not None
    last = (f"w{TAKEOVERS}", first_token + TAKEOVERS)
    assert (stored.lease.holder, stored.lease.token) == last
    last_generation(path.parent)


def test_a_staging_name_with_a_non_ascii_digit_is_not_a_pid(
    directory: Path, lock_path: Path
) -> None:
    """`.run.json.lock-staging.².x` names no pid (`'²'.isdigit()` is true in Python): it is left
    alone, and the lock is taken, not refused by `int('²')`."""
    odd = directory / ".run.json.lock-staging.\u00b2.x"
    odd.write_bytes(b"")
    with LockFile(lock_path, SHORT).held():
        assert odd.exists()
