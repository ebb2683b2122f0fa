"""`make soak`: does the gateway's memory stay flat under a long stream of new keys?

A leak per request (a dict of finished operations, a growing metrics label
set, an unbounded cache) is invisible in a 10 s benchmark row and fatal after
a week. This runs the gateway on SQLite under the miss path (a new key per
request, each with a body of its own: `bench.loadgen.JsonBodies`) at moderate
concurrency for `--minutes`, samples its resident memory (VmRSS) every
`--interval` seconds, and compares the mean of the last third
of the samples with the mean of the first third, ignoring the first minute
(imports, pools and caches filling up). A ratio near 1.0 is flat; the
retention and the sweeper keep their production defaults, so stored
receipts grow on disk, not in memory.

    python -m bench.soak --minutes 10 --write
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench import processes
from bench.gateway_config import ROUTE_PREFIX, sqlite_url, write_gateway_config
from bench.loadgen import LoadResult, LoadSpec, finish_load, start_load
from bench.procstat import rss_bytes
from bench.report import SOAK_HEADING, Table, machine_info, ratio
from bench.run import RESULTS

__all__ = ["Sample", "main", "trend"]

_MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Sample:
    """The gateway's resident memory `seconds` after the load started."""

    seconds: float
    rss_bytes: int


def trend(samples: Sequence[Sample], warmup: float) -> tuple[float, float] | None:
    """Mean RSS of the first and the last third of the samples after `warmup` seconds.

    None when fewer than three samples are left (too short a run to say).

    >>> trend([Sample(t, 100 + t) for t in range(0, 90, 10)], warmup=30)
    (140.0, 180.0)
    """
    kept = [sample.rss_bytes for sample in samples if sample.seconds >= warmup]
    if len(kept) < 3:
        return None
    third = len(kept) // 3
    return statistics.fmean(kept[:third]), statistics.fmean(kept[-third:])


def soak(
    minutes: float, *, concurrency: int, interval: float, workdir: Path
) -> tuple[list[Sample], LoadResult]:
    """Run the load and sample the gateway's RSS until the load ends."""
    samples: list[Sample] = []
    with processes.tool_api(workdir) as api:
        config = write_gateway_config(
            workdir / "soak.toml", upstream=api.url, store_url=sqlite_url(workdir / "soak.db")
        )
        with processes.gateway(config) as gateway:
            spec = LoadSpec(
                url=gateway.url + ROUTE_PREFIX + "/v1/issues",
                mode="new",
                concurrency=concurrency,
                duration=minutes * 60,
                warmup=0.0,
                cpu_pids=(gateway.pid,),
            )
            load = start_load(spec)
            try:
                started = time.monotonic()
                while load.poll() is None and time.monotonic() - started <= spec.duration:
                    sample = Sample(time.monotonic() - started, rss_bytes(gateway.pid))
                    samples.append(sample)
                    print(
                        f"  {sample.seconds:6.0f} s  {sample.rss_bytes / _MIB:7.1f} MiB",
                        file=sys.stderr,
                        flush=True,
                    )
                    time.sleep(max(0.0, started + len(samples) * interval - time.monotonic()))
                result = finish_load(load, spec)
            finally:
                if load.poll() is None:
                    load.kill()
                    load.wait()
    return samples, result


def render(
    samples: Sequence[Sample],
    result: LoadResult,
    *,
    minutes: float,
    concurrency: int,
    warmup: float,
    machine: Sequence[str],
) -> str:
    """The soak's result as a Markdown section (heading `## Soak`)."""
    means = trend(samples, warmup)
    if means is None:
        verdict = f"too short to judge: fewer than 3 samples after the {warmup:g} s warm-up"
    else:
        first, last = means
        verdict = (
            f"mean RSS, last third / first third (after {warmup:g} s): "
            f"{last / _MIB:.1f} / {first / _MIB:.1f} MiB = **{ratio(last, first)}**"
        )
    series = Table(
        ("seconds", "RSS MiB"),
        tuple((f"{s.seconds:.0f}", f"{s.rss_bytes / _MIB:.1f}") for s in samples),
    )
    return "\n".join(
        [
            f"{SOAK_HEADING} ({minutes:g} min, gateway on SQLite, new keys, c={concurrency})",
            "",
            *machine,
            f"- load: {result.ok + result.duplicates:,} answered at "
            f"{result.throughput:,.0f} req/s, p50 {result.p50_ms:.2f} ms, p99 "
            f"{result.p99_ms:.2f} ms, 409 {result.duplicates}, other non-2xx "
            f"{result.non_2xx}, errors {result.errors}",
            f"- {verdict}",
            "",
            series.render(),
        ]
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak", description="Watch the gateway's memory under long load."
    )
    parser.add_argument("--minutes", type=float, default=10.0, help="load duration (default 10)")
    parser.add_argument("--concurrency", type=int, default=16, help="requests in flight")
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between samples")
    parser.add_argument(
        "--warmup-seconds", type=float, default=60.0, help="samples ignored by the trend"
    )
    parser.add_argument(
        "--write", action="store_true", help=f"write the result to {RESULTS} (after the benchmark)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the soak; print the series and the trend; with `--write`, put them in RESULTS.md."""
    args = _parser().parse_args(argv)
    if args.minutes <= 0 or args.interval <= 0 or args.concurrency < 1:
        print("soak: --minutes and --interval must be > 0, --concurrency >= 1", file=sys.stderr)
        return 2
    machine = machine_info()
    with tempfile.TemporaryDirectory(prefix="gateway-soak-") as tmp:
        samples, result = soak(
            args.minutes, concurrency=args.concurrency, interval=args.interval, workdir=Path(tmp)
        )
    text = render(
        samples,
        result,
        minutes=args.minutes,
        concurrency=args.concurrency,
        warmup=args.warmup_seconds,
        machine=machine,
    )
    print(text, flush=True)
    if args.write:
        # The latest soak replaces an earlier one: RESULTS.md describes one state of the code.
        existing = RESULTS.read_text() if RESULTS.exists() else ""
        benchmark = existing.split(f"\n{SOAK_HEADING}", 1)[0].rstrip("\n")
        RESULTS.write_text((benchmark + "\n\n" if benchmark else "") + text + "\n")
        print(f"written to {RESULTS}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
