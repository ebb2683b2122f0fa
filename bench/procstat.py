"""What a process has used, read from /proc: CPU time and resident memory.

psutil would do this, but it is not a dependency and the numbers we need
are one `read()` each. Linux only, like the benchmark itself.

A server may be a process tree (the gateway's supervisor and its workers,
`bench.plain_proxy --processes N`), so `tree_cpu` reads a process and all
its descendants. It finds them by scanning every /proc/<pid>/stat for its
parent pid: /proc/<pid>/task/<tid>/children would be cheaper, but it needs
CONFIG_PROC_CHILDREN, which kernels (this machine's among them) may lack.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

__all__ = [
    "context_switches",
    "cpu_seconds",
    "rss_bytes",
    "thread_cpu",
    "tree_cpu",
    "tree_cpu_delta",
]

_TICKS = os.sysconf("SC_CLK_TCK")
_PROC = Path("/proc")


def _stat_fields(pid: int) -> list[str]:
    """/proc/<pid>/stat from field 3 (state) on: fields[0] is field 3, fields[1] the ppid."""
    return _stat_fields_of(_PROC / str(pid) / "stat")


def _stat_fields_of(path: Path) -> list[str]:
    raw = path.read_text()
    # The command name (field 2) is in parentheses and may hold spaces: split after it.
    return raw[raw.rindex(")") + 2 :].split()


def _cpu_of(fields: list[str]) -> float:
    # utime (14) and stime (15) are at 11 and 12. Not cutime/cstime (16, 17):
    # those hold children already reaped, over their whole lives, not this window.
    return (int(fields[11]) + int(fields[12])) / _TICKS


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds the process has used so far (its threads included).

    >>> cpu_seconds(os.getpid()) >= 0.0
    True
    """
    return _cpu_of(_stat_fields(pid))


def tree_cpu(root: int) -> dict[int, float]:
    """CPU seconds so far of `root` and of every descendant alive now, by pid.

    Children of children count too. A process that exits while /proc is
    being read is left out; `root` itself must exist (else
    FileNotFoundError, as `cpu_seconds`).

    >>> tree = tree_cpu(os.getpid())
    >>> os.getpid() in tree and all(seconds >= 0 for seconds in tree.values())
    True
    """
    root_cpu = cpu_seconds(root)
    children: dict[int, list[int]] = {}
    cpu: dict[int, float] = {}
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            fields = _stat_fields(pid)
        except (FileNotFoundError, ProcessLookupError):
            continue  # it exited between the listing and the read
        children.setdefault(int(fields[1]), []).append(pid)
        cpu[pid] = _cpu_of(fields)
    tree = {root: root_cpu}
    pending = [root]
    while pending:
        for child in children.get(pending.pop(), ()):
            if child not in tree:
                tree[child] = cpu[child]
                pending.append(child)
    return tree


def tree_cpu_delta(before: Mapping[int, float], after: Mapping[int, float]) -> float:
    """CPU seconds a tree used between two `tree_cpu` samples.

    A process in `after` only was born in between: all its CPU counts. A
    process in `before` only exited in between: its last part is lost (not
    counted at all), which is the price of not following exits.

    >>> tree_cpu_delta({1: 2.0, 7: 1.0}, {1: 2.5, 9: 0.25})
    0.75
    """
    return sum(seconds - before.get(pid, 0.0) for pid, seconds in after.items())


def rss_bytes(pid: int) -> int:
    """The process's resident set size (VmRSS), in bytes.

    >>> rss_bytes(os.getpid()) > 0
    True
    """
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            value, unit = line.split()[1:3]
            if unit != "kB":
                raise ValueError(f"unexpected VmRSS unit {unit!r}")
            return int(value) * 1024
    raise ValueError(f"no VmRSS in /proc/{pid}/status (a kernel thread or a zombie?)")


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds so far of each of the process's threads, by thread id.

    The main thread's id is `pid`: in the gateway that is the event loop;
    the others are its helper threads (SQLite's commit thread among them).
    A thread that exits while this reads is left out.

    >>> os.getpid() in thread_cpu(os.getpid())
    True
    """
    cpu: dict[int, float] = {}
    for task in (_PROC / str(pid) / "task").iterdir():
        try:
            cpu[int(task.name)] = _cpu_of(_stat_fields_of(task / "stat"))
        except (FileNotFoundError, ProcessLookupError):
            continue
    return cpu


def context_switches(pid: int) -> int:
    """Voluntary plus involuntary context switches so far of all the process's threads.

    A thread that sleeps and is woken (a futex, epoll, a pipe) counts one
    voluntary switch; a thread the scheduler preempts counts an involuntary one.

    >>> context_switches(os.getpid()) > 0
    True
    """
    total = 0
    for task in (_PROC / str(pid) / "task").iterdir():
        try:
            text = (task / "status").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        for line in text.splitlines():
            if line.startswith(("voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:")):
                total += int(line.split()[1])
    return total
