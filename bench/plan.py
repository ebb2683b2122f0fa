"""How long and how hard each row runs: the full benchmark and the `--quick` smoke run.

Full: about 10 s a row at c=64 and at c=1, a million stored operations for
the store-scale run; the whole run, the defaults section included, takes
about 12 minutes on 2 cores.
Quick: c=8, 0.5 s a row, 10k stored operations and no PostgreSQL, so the smoke
test finishes in well under its 90 s budget.

The worker-process rows (`bench.worker_rows`: the plain proxy and the
gateway's miss path as 1 and as 2 processes on one port) run at the HTTP
rows' concurrency and duration, in both plans: 4 rows, about 45 s full and
under 6 s quick, server start-ups included.

The MCP rows (`bench.mcp_rows`) run at c=1 and c=16 whatever the HTTP rows'
concurrency: full, three answer forms at the HTTP rows' duration, plus the
gateway's key-less pass-through, each c=1 row in 4 windows alternating with
direct's; quick, one form of each protocol generation (2025-11-25 session with
JSON answers, 2026-07-28 stateless), 0.5 s a row in 2 windows.

Both run on the aiohttp load generator unless told otherwise: `bench.run`
picks wrk when it is installed (`--client auto`), and passes it in `client`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from bench.loadgen import Client, KeyMode, LoadSpec

__all__ = ["FULL", "QUICK", "Plan"]


@dataclass(frozen=True, slots=True)
class Plan:
    """One benchmark run's sizes."""

    concurrency: int = 64
    duration: float = 10.0
    """Measured seconds of every row."""
    warmup: float = 1.0
    """Unmeasured seconds before each row (connections open, caches warm)."""
    replay_keys: int = 1000
    small_store: int = 1_000
    large_store: int = 1_000_000
    postgres: bool = True
    client: Client = "aiohttp"
    """The load generator of every HTTP row; one for all, so the rows stay comparable."""
    mcp_forms: tuple[str, ...] = ("session-json", "session-sse", "stateless")
    """The MCP answer forms measured (`bench.mcp_rows.FORMS`); empty: no MCP rows."""
    mcp_concurrency: int = 16
    """Concurrency of the MCP throughput rows (their latency rows run at c=1)."""
    mcp_duration: float | None = None
    """Measured seconds of every MCP row (None: `duration`)."""
    mcp_pass_through: bool = True
    """Also run the first MCP form through the gateway without keys (the hop alone)."""
    mcp_segments: int = 4
    large_call_seconds: float = 8.0
    """How long agents send 1 MiB MCP calls while /healthz is measured (`bench.large_mcp`)."""
    """Windows each MCP c=1 row is cut into, alternating with the same form's other
    fronts (direct, gateway, no key), so that they see the machine alike."""
    worker_counts: tuple[int, ...] = (1, 2)
    """Serving processes of the worker-process rows (`bench.worker_rows`): the plain
    proxy and the gateway's miss path with each; empty: no such rows. 1 is the
    baseline of their "vs 1 process" ratios."""

    def spec(
        self,
        url: str,
        mode: KeyMode,
        *,
        pids: tuple[int, ...],
        concurrency: int | None = None,
        method: str = "POST",
        lookup_keys: int = 0,
        cpu_tree: bool = False,
    ) -> LoadSpec:
        """A load for one row of this plan (`cpu_tree`: charge `pids`' descendants too)."""
        return LoadSpec(
            url=url,
            mode=mode,
            concurrency=self.concurrency if concurrency is None else concurrency,
            duration=self.duration,
            warmup=self.warmup,
            method=method,
            replay_keys=self.replay_keys,
            lookup_keys=lookup_keys,
            cpu_pids=pids,
            cpu_tree=cpu_tree,
            client=self.client,
        )

    def with_overrides(self, **changes: object) -> Plan:
        """This plan with some sizes changed from the command line."""
        return replace(self, **changes)  # type: ignore[arg-type]


FULL = Plan()
QUICK = Plan(
    concurrency=8,
    duration=0.5,
    warmup=0.1,
    replay_keys=100,
    small_store=1_000,
    large_store=10_000,
    postgres=False,
    mcp_forms=("session-json", "stateless"),
    mcp_duration=0.5,
    mcp_pass_through=False,
    mcp_segments=2,
    large_call_seconds=2.0,
)
