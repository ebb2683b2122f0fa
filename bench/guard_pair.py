"""What a switch on the miss path costs, in alternating windows: the similar-operation
guard, or canonical JSON fingerprints.

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

Every request is a new key with a JSON body of its own (`bench.loadgen.JsonBodies`),
so the guard looks for a twin and finds none: its whole cost on this path.

`--compare canonical` measures the same way what JSON compared as JSON costs
(`gateway.engine.fingerprint`, version 2: the body parsed and written in its RFC
8785 canonical form before it is hashed) against a gateway that fingerprints the
bytes as received (version 1; `IDEMPOTENCY_GATEWAY_TESTING__CANONICAL_JSON=false`,
a switch for this measurement only).

    python -m bench.guard_pair --store sqlite --concurrency 64
    python -m bench.guard_pair --store postgres --concurrency 1 --rounds 6 --seconds 3
    python -m bench.guard_pair --compare canonical --concurrency 64
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench import postgres, processes
from bench.gateway_config import ROUTE_PREFIX, SimilarGuard, sqlite_url, write_gateway_config
from bench.loadgen import Client, LoadResult, LoadSpec, run_load
from bench.report import Table, ms, ratio
from bench.wrk import add_client_option, chosen_client

__all__ = ["COMPARISONS", "Side", "main", "measure_pair", "pair_table"]


@dataclass(frozen=True, slots=True)
class Side:
    """One gateway of a pair: its label, its route's `similar_guard`, its environment."""

    label: str
    similar_guard: SimilarGuard = "unsettled"
    env: Mapping[str, str] = field(default_factory=dict)


COMPARISONS: dict[str, tuple[str, tuple[Side, Side]]] = {
    "guard": ("similar guard", (Side("on"), Side("off", similar_guard="off"))),
    "canonical": (
        "canonical JSON",
        (Side("on"), Side("off", env={"IDEMPOTENCY_GATEWAY_TESTING__CANONICAL_JSON": "false"})),
    ),
}
"""What `--compare` may name: the switch's words, and its two sides (the default first)."""
SIDES = COMPARISONS["guard"][1]


def measure_pair(
    workdir: Path,
    *,
    store: str,
    concurrency: int,
    rounds: int,
    seconds: float,
    warmup: float,
    client: Client,
    compare: str = "guard",
) -> dict[str, list[tuple[LoadResult, int]]]:
    """Each side's windows (result, the gateway's pid), in the order they ran per side."""
    switch, sides = COMPARISONS[compare]
    windows: dict[str, list[tuple[LoadResult, int]]] = {side.label: [] for side in sides}
    with (
        processes.tool_api(workdir) as api,
        _store_urls(workdir, store, sides) as urls,
        contextlib.ExitStack() as stack,
    ):
        gateways = {}
        for side in sides:
            config = write_gateway_config(
                workdir / f"pair-{side.label}.toml",
                upstream=api.url,
                store_url=urls[side.label],
                similar_guard=side.similar_guard,
            )
            name = f"gateway {store}, {switch} {side.label}"
            gateways[side.label] = stack.enter_context(
                processes.gateway(config, name=name, env=side.env)
            )
        for index in range(rounds):
            order = [side.label for side in sides]
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
                    f"  round {index + 1} {switch} {label}: {result.throughput:,.0f} req/s, "
                    f"p50 {ms(result.p50_ms)} ms, statuses {result.statuses}",
                    file=sys.stderr,
                    flush=True,
                )
    return windows


@contextlib.contextmanager
def _store_urls(
    workdir: Path, store: str, sides: tuple[Side, ...] = SIDES
) -> Iterator[dict[str, str]]:
    """A fresh store for each side: SQLite files, or PostgreSQL schemas dropped after."""
    if store == "sqlite":
        yield {side.label: sqlite_url(workdir / f"pair-{side.label}.db") for side in sides}
        return
    schemas: dict[str, str] = {}
    try:
        for side in sides:
            schemas[side.label] = postgres.create_schema()
        yield {label: postgres.url_for(schema) for label, schema in schemas.items()}
    finally:
        for schema in schemas.values():
            postgres.drop_schema(schema)


def pair_table(
    windows: dict[str, list[tuple[LoadResult, int]]], concurrency: int, switch: str = "guard"
) -> Table:
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
        f"{switch} on",
        f"{switch} off",
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
        description="A switch's cost on the miss path (the similar-operation guard, or "
        "canonical JSON fingerprints), in alternating windows.",
    )
    parser.add_argument(
        "--compare",
        choices=tuple(COMPARISONS),
        default="guard",
        help="what to switch: the similar guard (default) or canonical JSON fingerprints",
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
            compare=args.compare,
        )
    switch = COMPARISONS[args.compare][0]
    print(f"{args.store}, load generator {client}, {args.seconds:g} s windows:\n")
    print(pair_table(windows, args.concurrency, switch).render(), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
