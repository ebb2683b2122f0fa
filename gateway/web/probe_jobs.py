"""Bulk probing after an outage: every unknown operation of a route, probed once, now.

After an upstream outage hundreds of operations may wait as `unknown`; an
operator asks for all of a route's to be probed at once instead of waiting
for each one's backoff. That is a bounded background job, one per route:
at most `PARALLEL` probes at a time (and never more than the route's
`max_concurrency`), one probe per operation, counts kept for the job's URL.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gateway.engine.models import Operation, State
from gateway.store.base import OperationFilter
from gateway.web.operation_json import iso

if TYPE_CHECKING:
    from gateway.engine.engine import IdempotencyEngine
    from gateway.store.base import Store

log = logging.getLogger("gateway.admin")

PARALLEL = 4


@dataclass
class ProbeJob:
    """One route's bulk probe: what it has done so far."""

    route: str
    started_at: float = field(default_factory=time.time)
    finished_at: float | None = None
    total: int = 0
    probed: int = 0
    applied: int = 0
    not_applied: int = 0
    still_unknown: int = 0
    failed: int = 0
    task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self.finished_at is None

    def as_json(self) -> dict[str, Any]:
        return {
            "route": self.route,
            "job": job_url(self.route),
            "state": "running" if self.running else "done",
            "total": self.total,
            "probed": self.probed,
            "applied": self.applied,
            "not_applied": self.not_applied,
            "still_unknown": self.still_unknown,
            "failed": self.failed,
            "started_at": iso(self.started_at),
            "finished_at": iso(self.finished_at),
        }


def job_url(route: str) -> str:
    return f"/admin/probe-jobs/{route}"


class ProbeJobs:
    """The jobs of this process, one per route; a finished job is kept until the next."""

    def __init__(self) -> None:
        self._jobs: dict[str, ProbeJob] = {}

    def get(self, route: str) -> ProbeJob | None:
        return self._jobs.get(route)

    def start(self, route: str, store: Store, engine: IdempotencyEngine, parallel: int) -> ProbeJob:
        """The route's running job, or a new one started now."""
        current = self._jobs.get(route)
        if current is not None and current.running:
            return current
        job = ProbeJob(route)
        job.task = asyncio.create_task(_run(job, store, engine, max(1, parallel)))
        self._jobs[route] = job
        return job

    async def close(self) -> None:
        for job in self._jobs.values():
            if job.task is not None and not job.task.done():
                job.task.cancel()
                await asyncio.gather(job.task, return_exceptions=True)


async def _run(job: ProbeJob, store: Store, engine: IdempotencyEngine, parallel: int) -> None:
    slots = asyncio.Semaphore(parallel)

    async def probe_one(operation: Operation) -> None:
        async with slots:
            try:
                probed = await engine.probe(operation, now=True)
            except Exception as exc:  # one operation's failure never ends the job
                job.failed += 1
                log.warning("bulk probe of %s failed: %s", operation.id, exc)
                return
            job.probed += 1
            state = None if probed is None else probed.state
            if state is State.COMPLETED:
                job.applied += 1
            elif state is State.RELEASED:
                job.not_applied += 1
            elif state is State.UNKNOWN:
                job.still_unknown += 1

    try:
        cursor: str | None = None
        while True:
            page = await store.list_operations(
                OperationFilter(state=State.UNKNOWN, route=job.route), limit=100, cursor=cursor
            )
            job.total += len(page.items)
            await asyncio.gather(*(probe_one(operation) for operation in page.items))
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
    except Exception as exc:
        log.error("bulk probe of route %s stopped: %s", job.route, exc)
    finally:
        job.finished_at = time.time()
        log.info("bulk probe done", extra={"event": "bulk_probe", **job.as_json()})
