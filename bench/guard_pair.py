"""What the similar-operation guard costs on the miss path, in alternating windows.

`bench.run`'s HTTP rows measure the gateway's miss row with the guard on (the
default) and, right after, the same row against a gateway with
`similar_guard = "off"`: one window each. On a shared machine one window can
be twice as slow as the next for reasons of its own, so a single pair can
show a cost (or a gain) that is only noise. This runs the same two gateways
side by side (each on a store of its own, SQLite or a PostgreSQL schema) and
measures them in `--rounds` pairs of windows, the order swapped every round
(on, off; off, on; ...), so drift and bursts fall on both; it prints every
window and the medians of each side's throughput, p50, p99 and CPU per
request, and their ratios.

Every request is a new key with a body of its own (`bench.loadgen.JsonBodies`),
so the guard looks for a twin and finds none: its whole cost on this path.

    python -m bench.guard_pair --store sqlite --concurrency 64
    python -m bench.guard_pair --store postgres --concurrency 1 --rounds 6 --seconds 3
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from bench import postgres, processes
from bench.gateway_config import ROUTE_PREFIX, SimilarGuard, sqlite_url, write_gateway_config
from bench.loadgen import Client, LoadResult, LoadSpec, run_load
from bench.report import Table, ms, ratio
from bench.wrk import add_client_option, chosen_client

__all__ = ["main", "measure_pair", "pair_table"]

SIDES: tuple[tuple[str, SimilarGuard], ...] = (("on", "unsettled"), ("off", "off"))
"""Each side's label and its route's `similar_guard` ("unsettled" is the default)."""


def measure_pair(
    workdir: Path,
    *,
    store: str,
    concurrency: int,
    rounds: int,
    seconds: float,
    warmup: float,
    client: Client,
) -> dict[str, list[tuple[LoadResult, int]]]:
    """Each side's windows (result, the gateway's pid), in the order they ran per side."""
    windows: dict[str, list[tuple[LoadResult, int]]] = {label: [] for label, _ in SIDES}
    with (
        processes.tool_api(workdir) as api,
        _store_urls(workdir, store) as urls,
        contextlib.ExitStack() as stack,
    ):
        gateways = {}
        for label, guard in SIDES:
            config = write_gateway_config(
                workdir / f"pair-{label}.toml",
                upstream=api.url,
                store_url=urls[label],
                similar_guard=guard,
            )
            name = f"gateway {store}, similar guard {label}"
            gateways[label] = stack.enter_context(processes.gateway(config, name=name))
        for index in range(rounds):
            order = [label for label, _ in SIDES]
            if index % 2:
                order.reverse()
            for label in order:
                gateway = gateways[label]
                spec = LoadSpec(
                    url=gateway.url + ROUTE_PREFIX + "/v1/issues",
                    mode="new",
                    concurrency=concurrency,
                    duration=seconds,
                    warmup=warmup,
                    cpu_pids=(gateway.pid,),
                    client=client,
                )
                result = run_load(spec)
                windows[label].append((result, gateway.pid))
                print(
                    f"  round {index + 1} guard {label}: {result.throughput:,.0f} req/s, "
                    f"p50 {ms(result.p50_ms)} ms, statuses {result.statuses}",
                    file=sys.stderr,
                    flush=True,
                )
    return windows


@contextlib.contextmanager
def _store_urls(workdir: Path, store: str) -> Iterator[dict[str, str]]:
    """A fresh store for each side: SQLite files, or PostgreSQL schemas dropped after."""
    if store == "sqlite":
        yield {label: sqlite_url(workdir / f"pair-{label}.db") for label, _ in SIDES}
        return
    schemas: dict[str, str] = {}
    try:
        for label, _ in SIDES:
            schemas[label] = postgres.create_schema()
        yield {label: postgres.url_for(schema) for label, schema in schemas.items()}
    finally:
        for schema in schemas.values():
            postgres.drop_schema(schema)


def pair_table(windows: dict[str, list[tuple[LoadResult, int]]], concurrency: int) -> Table:
    """Each side's medians over its windows, and on over off."""
    medians = {
        label: {
            name: statistics.median(_figures(result, pid)[name] for result, pid in runs)
            for name in _FIGURES
        }
        for label, runs in windows.items()
    }
    body = []
    for name in _FIGURES:
        on, off = medians["on"][name], medians["off"][name]
        shown = ms if name.endswith(" ms") else lambda value: f"{value:,.0f}"
        body.append((f"{name}, median", shown(on), shown(off), ratio(on, off)))
    failed = {
        label: sum(result.duplicates + result.non_2xx + result.errors for result, _ in runs)
        for label, runs in windows.items()
    }
    body.append(("409, other non-2xx and errors, all windows", *map(str, failed.values()), ""))
    header = (
        f"miss path, c={concurrency}, {len(windows['on'])} windows each",
        "guard on",
        "guard off",
        "on / off",
    )
    return Table(header, tuple(body))


_FIGURES = ("req/s", "p50 ms", "p99 ms", "server CPU us/req")


def _figures(result: LoadResult, pid: int) -> dict[str, float]:
    return {
        "req/s": result.throughput,
        "p50 ms": result.p50_ms,
        "p99 ms": result.p99_ms,
        "server CPU us/req": result.cpu_us_per_request(pid),
    }


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.guard_pair",
        description="The similar-operation guard's cost on the miss path, alternating windows.",
    )
    parser.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--concurrency", type=int, default=64, help="requests in flight")
    parser.add_argument("--rounds", type=int, default=4, help="windows per side (default 4)")
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds a window")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds first")
    add_client_option(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the alternating windows and print the medians as a Markdown table."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.seconds <= 0 or args.concurrency < 1:
        print("guard_pair: --rounds and --concurrency >= 1, --seconds > 0", file=sys.stderr)
        return 2
    client = chosen_client(args.client, parser)
    with tempfile.TemporaryDirectory(prefix="gateway-guard-pair-") as tmp:
        windows = measure_pair(
            Path(tmp),
            store=args.store,
            concurrency=args.concurrency,
            rounds=args.rounds,
            seconds=args.seconds,
            warmup=args.warmup,
            client=client,
        )
    print(f"{args.store}, load generator {client}, {args.seconds:g} s windows:\n")
    print(pair_table(windows, args.concurrency).render(), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
