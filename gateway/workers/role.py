"""What the supervisor tells a worker at start: who it is and what it inherits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.workers.channel import WorkerChannel


@dataclass(frozen=True, slots=True)
class WorkerRole:
    """One worker's identity and inheritance, sent (pickled, with the settings) on its stdin."""

    index: int
    """0 to workers - 1; a restarted worker keeps its slot's index."""
    owner: str
    """Its lease-owner name: unique per start, so a restart never inherits a dead lease."""
    supervisor_pid: int
    channel_descriptor: int
    """Its end of a datagram socket pair with the supervisor (`gateway.workers.channel`)."""
    lock_descriptor: int | None
    """The gateway's lock on the SQLite file, held by the supervisor; None on PostgreSQL."""
    first: bool
    """Started alone before any other worker: what it finds in flight is an earlier gateway's."""
    metrics_directory: str = ""
    """Where every worker publishes its metrics snapshot (`gateway.web.metrics_processes`)."""
    dead_owners: tuple[str, ...] = ()
    """Lease owners of workers that died in this slot: their claims turn `unknown` at start."""


@dataclass(frozen=True, slots=True)
class RunningWorker:
    """A worker as its app sees it: its role, and its live channel to the supervisor."""

    role: WorkerRole
    channel: WorkerChannel
