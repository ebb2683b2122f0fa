"""Markdown for the results, the machine they were measured on, and bench/RESULTS.md.

Numbers from this machine move 15-25% between runs, so the tables put the
ratios measured within one run (to the plain proxy, to direct, 1M rows to
1k) beside the absolute figures, and the header records what the machine
was and how loaded it was when the run started.
"""

from __future__ import annotations

import datetime
import math
import os
import platform
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

__all__ = [
    "SOAK_HEADING",
    "Table",
    "machine_info",
    "ms",
    "ratio",
    "write_results",
]

SOAK_HEADING = "## Soak"
"""The section `bench.soak` writes after the benchmark; `write_results` keeps it."""


@dataclass(frozen=True, slots=True)
class Table:
    """A Markdown table: a header row and rows of already formatted cells."""

    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]

    def render(self) -> str:
        """The table as GitHub Markdown.

        >>> print(Table(("a", "b"), (("1", "2"),)).render())
        | a | b |
        |---|---|
        | 1 | 2 |
        """
        lines = [
            "| " + " | ".join(self.header) + " |",
            "|" + "|".join("---" for _ in self.header) + "|",
        ]
        lines += ["| " + " | ".join(row) + " |" for row in self.rows]
        return "\n".join(lines)


def ms(value: float) -> str:
    """Milliseconds with precision that suits their size ("n/a" for NaN)."""
    if math.isnan(value):
        return "n/a"
    return f"{value:.2f}" if value < 10 else f"{value:.1f}" if value < 100 else f"{value:.0f}"


def ratio(numerator: float, denominator: float) -> str:
    """`numerator / denominator` as "0.62x" ("n/a" when undefined)."""
    if denominator <= 0 or math.isnan(numerator) or math.isnan(denominator):
        return "n/a"
    return f"{numerator / denominator:.2f}x"


def machine_info() -> list[str]:
    """Markdown bullet lines: CPUs, CPU model, versions, load and date.

    Call it when the run starts: the load average says how busy the shared
    machine was before our own processes added to it.
    """
    model = "unknown"
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    usable = len(os.sched_getaffinity(0))
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    try:
        uvloop = metadata.version("uvloop")
    except metadata.PackageNotFoundError:
        uvloop = "not installed (the gateway uses the default asyncio loop)"
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return [
        f"- date: {now}",
        f"- CPUs (nproc): {usable}; model: {model}",
        f"- load average when the run started (1, 5, 15 min): {load}",
        f"- Python {platform.python_version()}, aiohttp {metadata.version('aiohttp')}, "
        f"SQLite {sqlite3.sqlite_version}, uvloop {uvloop}",
        f"- kernel: {platform.release()}",
    ]


def filesystem_of(path: Path) -> str:
    """The type and device of the filesystem `path` is on, from /proc/mounts (the
    longest mount point that holds it): a store on tmpfs never waits for a disk.

    >>> filesystem_of(Path("/proc/self")).startswith("proc")
    True
    """
    resolved = str(path.resolve())
    best, found = "", "an unknown filesystem"
    with open("/proc/mounts") as mounts:
        for line in mounts:
            device, point, kind = line.split()[:3]
            point = point.replace("\\040", " ")
            inside = resolved == point or resolved.startswith(point.rstrip("/") + "/")
            if inside and len(point) >= len(best):
                best, found = point, f"{kind} ({device}, mounted at {point})"
    return found


def write_results(path: Path, text: str) -> None:
    """Replace `path` with `text`, keeping the soak section written earlier."""
    kept: Sequence[str] = ()
    if path.exists():
        old = path.read_text()
        start = old.find(f"\n{SOAK_HEADING}")
        if start >= 0:
            kept = (old[start:].strip("\n"),)
    path.write_text("\n\n".join([text.rstrip("\n"), *kept]) + "\n")
