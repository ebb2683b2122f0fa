"""`bench.wrk`: wrk drives every key mode against a real gateway, as the aiohttp generator would.

The benchmark's numbers are only as good as its requests: a key mode that
sent the wrong keys (replays that are misses, misses that collide) would
measure the wrong path and still print a plausible table. So each mode runs
for about a second against the tool API and a gateway on loopback, started as
`make bench` starts them, and what the servers saw is checked against what
wrk reported: new keys each made one operation and one ticket (never refused
as the same request as another key's: each new key sends its own body),
replays made none, mix10 made fewer tickets than requests. wrk is optional for
`make bench`, so these tests skip where it is missing; `.ci/run` installs it
(Debian package wrk), so CI runs them. The aiohttp path is covered by
tests/test_bench_smoke.py.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import time
import urllib.request
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bench import processes
from bench.gateway_config import ROUTE_PREFIX, sqlite_url, write_gateway_config
from bench.loadgen import KEY_ROOM, KeyMode, LoadResult, LoadSpec, json_body, run_load
from bench.prefill import prefill
from bench.wrk import _script_options

pytestmark = pytest.mark.slow


@pytest.fixture
def wrk_installed() -> None:
    """Skip where wrk is missing, except in CI, which must have it (`.ci/run` installs it)."""
    if shutil.which("wrk") is not None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail("wrk is not installed: .ci/run installs the Debian package wrk")
    pytest.skip("wrk is not installed (apt-get install wrk)")


needs_wrk = pytest.mark.usefixtures("wrk_installed")

CONCURRENCY = 4
REPLAY_KEYS = 50
PREFILLED = 200
"""Operations written into the gateway's store before it starts, for lookup."""


@dataclass(frozen=True)
class Servers:
    """The tool API and a gateway in front of it, on a pre-filled SQLite store."""

    api: processes.ServerProcess
    gateway: processes.ServerProcess
    store: Path

    @property
    def issues_url(self) -> str:
        return self.gateway.url + ROUTE_PREFIX + "/v1/issues"

    def tickets(self) -> int:
        """Tickets the tool API has created: the effects that reached it."""
        with urllib.request.urlopen(self.api.url + "/v1/stats", timeout=10) as response:
            stats: dict[str, Any] = json.loads(response.read())
        return int(stats["issues"])

    def operations(self) -> int:
        """Operations in the gateway's store (read-only beside the running gateway)."""
        return self._count("SELECT count(*) FROM operations")

    def repeated_requests(self) -> int:
        """Operations whose request (fingerprint) another operation had already."""
        return self._count("SELECT count(*) - count(DISTINCT fingerprint) FROM operations")

    def settled(self) -> None:
        """Wait until no operation is in flight: the requests an earlier wrk run left
        behind when it stopped have made their tickets and their receipts."""
        for _ in range(600):  # bounded: at most CONCURRENCY requests are left over
            if self._count("SELECT count(*) FROM operations WHERE state = 'in_flight'") == 0:
                return
            time.sleep(0.05)
        raise AssertionError("operations stayed in flight after the wrk run stopped")

    def _count(self, query: str) -> int:
        uri = f"file:{self.store}?mode=ro"
        with closing(sqlite3.connect(uri, uri=True, timeout=10)) as connection:
            count: int = connection.execute(query).fetchone()[0]
        return count


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    workdir = tmp_path_factory.mktemp("bench-wrk")
    store = workdir / "gateway.db"
    prefill(store, PREFILLED)
    with processes.tool_api(workdir) as api:
        config = write_gateway_config(
            workdir / "gateway.toml", upstream=api.url, store_url=sqlite_url(store)
        )
        with processes.gateway(config) as gateway:
            yield Servers(api, gateway, store)


def _run(url: str, mode: KeyMode, pid: int, **changes: Any) -> LoadResult:
    """About 1.3 s of wrk (0.3 s warm-up, 1 s measured) through `run_load`, as bench.run does."""
    sizes: dict[str, Any] = {
        "concurrency": CONCURRENCY,
        "duration": 1.0,
        "warmup": 0.3,
        "replay_keys": REPLAY_KEYS,
    }
    spec = LoadSpec(url=url, mode=mode, cpu_pids=(pid,), client="wrk", **{**sizes, **changes})
    return run_load(spec)


def _assert_clean(result: LoadResult, pid: int) -> None:
    """Responses came, all answered, none failed, and the server was charged for them."""
    assert result.responses > 0, result
    assert result.ok > 0, result
    assert (result.errors, result.non_2xx) == (0, 0), result
    assert result.responses == result.ok + result.duplicates
    assert result.server_cpu[str(pid)] > 0, result
    assert 0 < result.p50_ms <= result.p99_ms <= result.max_ms, result
    assert result.client_cpu > 0, result


@needs_wrk
def test_new_keys_each_make_one_operation(servers: Servers) -> None:
    servers.settled()
    operations, tickets = servers.operations(), servers.tickets()
    result = _run(servers.issues_url, "new", servers.gateway.pid)
    _assert_clean(result, servers.gateway.pid)
    assert result.statuses == {"201": result.ok}, "a new key was refused or replayed"
    assert 0.9 < result.seconds < 1.5, result
    # The warm-up run's keys and the requests in flight at the end come on top.
    assert servers.operations() - operations >= result.ok
    assert servers.tickets() - tickets >= result.ok
    # Every key its own request: the pre-filled ones, the warm-up run's and the measured run's.
    assert servers.repeated_requests() == 0


@needs_wrk
def test_replay_makes_no_new_effect(servers: Servers) -> None:
    servers.settled()
    operations, tickets = servers.operations(), servers.tickets()
    result = _run(servers.issues_url, "replay", servers.gateway.pid)
    _assert_clean(result, servers.gateway.pid)
    assert result.statuses == {"201": result.ok}, result
    # Only the keys sent once beforehand reached the tool API; wrk's runs only replayed.
    assert servers.tickets() - tickets == REPLAY_KEYS
    assert servers.operations() - operations == REPLAY_KEYS


MIX10_RESPONSES = 400
"""Responses a mix10 run needs: about 40 reuses, ten times the CONCURRENCY requests whose
tickets may be made after wrk stopped counting."""


@needs_wrk
def test_mix10_reuses_keys(servers: Servers) -> None:
    """About 10% of mix10's requests reuse a key and make no ticket, so fewer tickets come."""
    # A second is hundreds of responses on an idle machine, a few dozen on a loaded one: the
    # run is lengthened until it has enough for the reuses to outnumber the requests in flight.
    duration = 1.0
    while True:
        tickets = servers.tickets()
        # No warm-up run, so every ticket made is from a request wrk reported (or
        # one of the CONCURRENCY in flight when it stopped).
        result = _run(
            servers.issues_url, "mix10", servers.gateway.pid, warmup=0.0, duration=duration
        )
        made = servers.tickets() - tickets
        if result.responses >= MIX10_RESPONSES or duration >= 60:
            break
        duration = min(60.0, 1.5 * duration * MIX10_RESPONSES / max(result.responses, 1))
    _assert_clean(result, servers.gateway.pid)
    assert set(result.statuses) <= {"201", "409"}, result
    assert result.responses >= MIX10_RESPONSES, result
    assert made < result.responses, (made, result)
    assert made >= 0.7 * result.responses, (made, result)


@needs_wrk
def test_none_sends_no_key_and_stops_on_time(servers: Servers) -> None:
    tickets = servers.tickets()
    # Straight at the tool API, like the benchmark's `direct` row; 0.5 s is not
    # a whole second, so wrk is stopped with SIGINT rather than by its -d.
    result = _run(servers.api.url + "/v1/issues", "none", servers.api.pid, duration=0.5)
    _assert_clean(result, servers.api.pid)
    assert result.statuses == {"201": result.ok}, result
    assert 0.4 < result.seconds < 0.9, result
    assert servers.tickets() - tickets >= result.ok


@needs_wrk
def test_lookup_finds_prefilled_keys(servers: Servers) -> None:
    result = _run(
        servers.gateway.url + "/operations/{key}",
        "lookup",
        servers.gateway.pid,
        method="GET",
        lookup_keys=PREFILLED,
    )
    _assert_clean(result, servers.gateway.pid)
    assert result.statuses == {"200": result.ok}, "a looked-up key was not the pre-filled one"


@pytest.mark.parametrize("size", [37 + KEY_ROOM, 200, 4096])
def test_the_script_builds_the_generators_bodies(tmp_path: Path, size: int) -> None:
    """wrk_keys.lua writes a key over the template at tag_at; the bytes are those the
    aiohttp generator (and bench.wrk's replay warm-up) sends under that key."""
    spec = LoadSpec(url="http://127.0.0.1:1/", mode="replay", body_size=size, client="wrk")
    options = _script_options(spec, tmp_path)
    template = Path(options["body"]).read_bytes()
    at, room = int(options["tag_at"]), int(options["tag_room"])
    assert template == json_body(size)
    assert room >= KEY_ROOM
    keys = ("bench-0a1b2c3d-r7", "bench-0a1b2c3d-w-t0-123456", "k" * room)
    for key in keys:
        built = template[:at] + key.encode() + template[at + len(key) :]  # as the script does
        assert built == json_body(size, key)
        assert len(built) == size
        assert json.loads(built)["pad"].startswith(key)
    assert len({json_body(size, key) for key in keys}) == len(keys)


def test_a_keyed_body_has_room_for_its_key() -> None:
    with pytest.raises(ValueError, match="body_size"):
        LoadSpec(url="http://127.0.0.1:1/", mode="new", body_size=37 + KEY_ROOM - 1)
    LoadSpec(url="http://127.0.0.1:1/", mode="none", body_size=37)  # no key, no room needed


def test_a_response_cap_needs_aiohttp() -> None:
    """wrk stops on time only: a row capped by responses cannot say it ran on wrk."""
    with pytest.raises(ValueError, match="requests"):
        LoadSpec(url="http://127.0.0.1:1/", mode="new", requests=10, client="wrk")
    with pytest.raises(ValueError, match="client"):
        LoadSpec(url="http://127.0.0.1:1/", mode="new", client="curl")  # type: ignore[arg-type]
