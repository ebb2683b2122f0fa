"""What a process has used, read from /proc: CPU time and resident memory.

psutil would do this, but it is not a dependency and the two numbers we need
are one `read()` each. Linux only, like the benchmark itself.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cpu_seconds", "rss_bytes"]

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds the process has used so far (its threads included).

    >>> cpu_seconds(os.getpid()) >= 0.0
    True
    """
    raw = Path(f"/proc/{pid}/stat").read_text()
    # The command name (field 2) is in parentheses and may hold spaces: split after it.
    fields = raw[raw.rindex(")") + 2 :].split()
    # fields[0] is field 3 (state), so utime (14) and stime (15) are at 11 and 12.
    return (int(fields[11]) + int(fields[12])) / _TICKS


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
