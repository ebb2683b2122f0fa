"""The store's own cost: CPU of the durable claim and receipt writes, with no HTTP at all.

`bench/PROFILE.md` compares the gateway's miss path with a plain proxy; the
two durable writes are the part of the difference no request path can avoid.
This measures them alone: `concurrency` tasks each claim a new key and record
its receipt through `SqliteStore` (group commit, `synchronous=FULL`, as in
production), for `duration` seconds, and it reports pairs per second and this
process's CPU per pair (the event loop and the commit thread together).

    python -m bench.store_cpu                 # c=64, 5 s, a fresh file in /tmp
    python -m bench.store_cpu --concurrency 1
    python -m bench.store_cpu --concurrency 1 --gap 2.5 --dir /dev/shm

`--gap MS` waits that long between each claim and its receipt, as a miss
waits for its upstream: at c=1 the disk and the threads then go idle between
commits, as they do under the gateway. `--dir` puts the file elsewhere (a
tmpfs takes the disk out). At c=1 it also prints the p50 wall time of a claim and of a receipt.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from gateway.engine.models import ClaimRequest, NewAttempt, Resolution, StoredResponse
from gateway.store.sqlite import SqliteStore

__all__ = ["main", "measure"]

_RECEIPT = StoredResponse(
    status=201,
    headers=(("Content-Type", "application/json"), ("Content-Length", "64")),
    body=b'{"id": "t-1", "title": "benchmark ticket", "status": "open"}' + b" " * 4,
)


async def measure(
    path: Path,
    *,
    concurrency: int,
    duration: float,
    gap: float = 0.0,
    waits: list[tuple[float, float]] | None = None,
) -> tuple[float, float]:
    """Pairs per second and CPU microseconds per pair over `duration` seconds; `gap`
    seconds of sleep between each claim and its receipt (not CPU, but wall time).
    `waits`, when given, gets each pair's claim and receipt wall times (seconds)."""
    store = SqliteStore(path=path)
    await store.open()
    keys = itertools.count()
    stop = time.monotonic() + duration
    pairs = 0

    async def worker() -> None:
        nonlocal pairs
        while time.monotonic() < stop:
            asked = time.perf_counter()
            claim = await store.claim(
                ClaimRequest(
                    scope="bench",
                    key=f"k-{next(keys)}",
                    fingerprint="sha256:" + "0" * 64,
                    route="tickets",
                    method="POST",
                    path="/tickets/v1/issues",
                    owner="bench",
                    lease_seconds=30,
                    tombstone_seconds=86_400,
                )
            )
            claimed = time.perf_counter()
            assert isinstance(claim, NewAttempt)
            operation = claim.operation
            if gap:
                await asyncio.sleep(gap)
            recording = time.perf_counter()
            done = await store.complete(
                operation.id,
                operation.token,
                _RECEIPT,
                body_retained=True,
                retention_seconds=86_400,
                tombstone_seconds=86_400,
                resolution=Resolution(by="upstream", at=time.time()),
            )
            assert done is not None
            if waits is not None:
                waits.append((claimed - asked, time.perf_counter() - recording))
            pairs += 1

    try:
        started, cpu_before = time.monotonic(), time.process_time()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed, cpu = time.monotonic() - started, time.process_time() - cpu_before
    finally:
        await store.close()
    return pairs / elapsed, cpu / pairs * 1e6


def main(argv: Sequence[str] | None = None) -> int:
    """Print pairs per second and CPU per pair."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.store_cpu", description="The SQLite store's durable writes alone."
    )
    parser.add_argument("--concurrency", type=int, default=64, help="tasks writing at once")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds (default 5)")
    parser.add_argument(
        "--gap", type=float, default=0.0, help="ms between a claim and its receipt (default 0)"
    )
    parser.add_argument("--dir", type=Path, help="where the store file goes (default: /tmp)")
    args = parser.parse_args(argv)
    waits: list[tuple[float, float]] = []
    with tempfile.TemporaryDirectory(prefix="store-cpu-", dir=args.dir) as tmp:
        rate, cpu = asyncio.run(
            measure(
                Path(tmp) / "s.db",
                concurrency=args.concurrency,
                duration=args.duration,
                gap=args.gap / 1000,
                waits=waits,
            )
        )
    wall = (
        f"; p50 {statistics.median(w[0] for w in waits) * 1000:.2f} ms a claim, "
        f"{statistics.median(w[1] for w in waits) * 1000:.2f} ms a receipt"
        if args.concurrency == 1 and waits
        else ""
    )
    print(
        f"c={args.concurrency}: {rate:,.0f} claim+receipt pairs/s, "
        f"{cpu:.0f} us of CPU per pair (loop and commit thread){wall}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
