"""MCP servers on stdio behind the gateway (issue "MCP servers on stdio ...").

Most MCP servers speak stdio only. A route with `command = [...]` has the gateway start
the server as a child and give its calls every guarantee of an HTTP MCP route. Here a
real stdio server on the official SDK (`tests/stdio_mcp_server.py`) runs behind a real
gateway, and official-SDK clients call it: a keyed call runs once and its retry is
replayed; a child killed mid-call leaves the call `unknown` and the probe by tool
settles it; the next call gets a new child; the child sees only its route's `env`;
its requests to the client are refused; each caller scope has a child of its own
unless `shared_tenants`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from conftest import GatewayFactory
from harness import ADMIN_TOKEN, GatewayProcess, RunningGateway, spawn
from mcp_upstream import LEGACY, MODERN, call_with_key, mcp_client
from pydantic import ValidationError
from worker_processes import wait_for_workers

from gateway.config import RouteSettings, Settings

SERVER = str(Path(__file__).with_name("stdio_mcp_server.py"))
PREFIX = "/fs"
TIMEOUT = 60
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
UNUSED = "http://127.0.0.1:9"  # the harness's first route: nothing here calls it


def stdio_route(tmp_path: Path, **options: Any) -> dict[str, Any]:
    return {
        "name": "fs",
        "prefix": PREFIX,
        "kind": "mcp",
        "command": [
            sys.executable,
            SERVER,
            str(tmp_path / "effects.jsonl"),
            str(tmp_path / "started.jsonl"),
        ],
        "env": {"ROUTE_ONLY": "${HOME}"},
        **options,
    }


PROBE = {
    "tool": "find_ticket",
    "arguments": {"key": "{forwarded_key}"},
    "applied_pointer": "/found",
    "applies_to": ["create_ticket", "slow_ticket"],
    "sees_all_callers": True,
}


def effects(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "effects.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def started_call(tmp_path: Path) -> dict[str, Any]:
    """The first slow call's line, once the child has written it (the call is mid-way)."""
    path = tmp_path / "started.jsonl"
    async with asyncio.timeout(TIMEOUT):
        while not path.exists() or not path.read_text().strip():  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    line: dict[str, Any] = json.loads(path.read_text().splitlines()[0])
    return line


async def kill_the_child_mid_call(
    url: str, tmp_path: Path, key: str, *, forget_the_effect: bool = False
) -> tuple[dict[str, Any], Any]:
    """A keyed `slow_ticket` call, its child killed (SIGKILL) once the call runs: the
    child's started line, and the call's result."""
    async with mcp_client(url) as client:
        call = asyncio.create_task(
            call_with_key(client, "slow_ticket", {"title": key, "seconds": 120}, key)
        )
        started = await started_call(tmp_path)
        if forget_the_effect:
            (tmp_path / "effects.jsonl").unlink()
        os.kill(started["pid"], signal.SIGKILL)
        return started, await call


async def stdio_gateway(
    gateway_factory: GatewayFactory, tmp_path: Path, **options: Any
) -> RunningGateway:
    return await gateway_factory(
        UNUSED,
        extra_routes=[stdio_route(tmp_path, **options)],
        admin={"token": ADMIN_TOKEN},
    )


async def admin_json(gateway: RunningGateway, path: str, method: str = "GET") -> Any:
    assert gateway.admin_url is not None
    async with gateway.session.request(method, gateway.admin_url + path, headers=ADMIN) as answer:
        assert answer.status == 200, await answer.text()
        return await answer.json()


async def whoami(url: str, headers: Mapping[str, str] | None = None) -> dict[str, Any]:
    async with mcp_client(url, headers=headers) as client:
        result = await client.call_tool("whoami", {})
    assert not result.is_error, result
    return dict(result.structured_content or {})


async def test_a_keyed_call_on_a_stdio_server_runs_once_and_is_replayed(
    gateway_factory: GatewayFactory, tmp_path: Path
) -> None:
    """Through the SDK in both generations: the call runs once in the child, its retry on
    a new session (or in 2026-07-28, with `resultType`) gets the stored result."""
    gateway = await stdio_gateway(gateway_factory, tmp_path)
    url = gateway.url + PREFIX
    async with asyncio.timeout(TIMEOUT):
        async with mcp_client(url, mode=LEGACY) as client:
            tools = await client.list_tools()
            assert "create_ticket" in [tool.name for tool in tools.tools]
            first = await call_with_key(client, "create_ticket", {"title": "x"}, "run-1:0:c1")
        async with mcp_client(url, mode=MODERN) as client:
            again = await call_with_key(client, "create_ticket", {"title": "x"}, "run-1:0:c1")
            assert client.protocol_version == MODERN
    assert first.structured_content == again.structured_content
    assert not again.is_error
    assert dict(again.meta or {}).get("idempotencyReplayed") is True or again.meta
    made = effects(tmp_path)
    assert len(made) == 1, made
    lookup = await (await gateway.get("/operations/run-1:0:c1")).json()
    assert lookup["state"] == "completed"
    assert made[0]["key"] == lookup["id"]  # the forwarded key is the operation id


async def test_a_child_killed_mid_call_is_unknown_and_its_probe_settles_it(
    gateway_factory: GatewayFactory, tmp_path: Path
) -> None:
    """kill -9 of the child while a call runs: the call's answer is lost, so it is
    `unknown` (never a failure); the next call starts a new child; the probe asks that
    child's `find_ticket` (the children share their store) and completes the call."""
    gateway = await stdio_gateway(
        gateway_factory, tmp_path, probe=PROBE, shared_state=True, timeout="60s"
    )
    url = gateway.url + PREFIX
    async with asyncio.timeout(TIMEOUT):
        started, result = await kill_the_child_mid_call(url, tmp_path, "k-kill")
    assert result.is_error, result
    said = dict(result.meta or {})["idempotency"]
    assert said["type"].endswith("upstream-connection-lost"), said  # may have happened
    assert said.get("state") == "unknown", said
    after = await whoami(url)
    assert after["pid"] != started["pid"], "a new child serves the next call"

    lookup = await (await gateway.get("/operations/k-kill")).json()
    if lookup["state"] == "unknown":  # the gateway's own probe may have settled it already
        lookup = await admin_json(gateway, f"/admin/operations/{lookup['id']}/probe", "POST")
    operation = await admin_json(gateway, f"/admin/operations/{lookup['id']}")
    assert (operation["state"], operation["resolution"]["by"]) == ("completed", "probe")
    kinds = [event["type"] for event in operation["history"]]
    assert kinds.index("connection-lost") < kinds.index("resolved"), kinds
    assert len(effects(tmp_path)) == 1


async def test_the_child_sees_only_its_env_and_its_requests_are_refused(
    gateway_factory: GatewayFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing of the gateway's environment but PATH and HOME reaches the child, and a
    sampling request from it gets a clear refusal rather than hanging."""
    monkeypatch.setenv("GATEWAY_ONLY_SECRET", "s3cret")
    gateway = await stdio_gateway(gateway_factory, tmp_path)
    url = gateway.url + PREFIX
    async with asyncio.timeout(TIMEOUT):
        names = set((await whoami(url))["env"])
        async with mcp_client(url) as client:
            asked = await client.call_tool("ask_the_client", {})
    assert names - {"LC_CTYPE"} == {"PATH", "HOME", "ROUTE_ONLY"}, names
    refused = (asked.structured_content or {}).get("refused") or ""
    assert "only client and answers no server requests" in refused, asked


async def test_each_scope_has_a_child_unless_shared_tenants(
    gateway_factory: GatewayFactory, tmp_path: Path
) -> None:
    """Two callers (two credentials) get two children; with `shared_tenants` one."""
    for shared, children in ((False, 2), (True, 1)):
        gateway = await gateway_factory(
            UNUSED,
            extra_routes=[stdio_route(tmp_path, shared_tenants=shared)],
            idempotency={"shared_scope": False},
            store_url=f"sqlite:///{tmp_path / f'shared-{shared}.db'}",
        )
        url = gateway.url + PREFIX
        async with asyncio.timeout(TIMEOUT):
            pids = {
                (await whoami(url, {"Authorization": f"Bearer agent-{n}-credential"}))["pid"]
                for n in (1, 2, 1)
            }
        assert len(pids) == children, (shared, pids)


CRASHING = [sys.executable, "-c", "import sys; sys.exit(3)"]


async def test_a_server_that_keeps_dying_is_restarted_with_a_growing_backoff(
    gateway_factory: GatewayFactory, tmp_path: Path
) -> None:
    """A stdio server that exits at once: each call is refused as not made
    (`upstream-unreachable`: the key released, never `unknown`), and the wait before the
    next start doubles."""
    gateway = await gateway_factory(UNUSED, extra_routes=[stdio_route(tmp_path, command=CRASHING)])
    url = gateway.url + PREFIX
    waits = []
    async with asyncio.timeout(TIMEOUT):
        for n in range(3):
            async with mcp_client(url, mode=MODERN) as client:
                refused = await call_with_key(client, "create_ticket", {"title": "z"}, f"die-{n}")
            said = dict(refused.meta or {})["idempotency"]
            assert refused.is_error, refused
            assert said["type"].endswith("upstream-unreachable"), said  # not sent: retry
            assert "not made" in str(refused.content), refused.content
            text = said["detail"]
            match = re.search(r"(?:tried again|restarted) in ([\d.]+) s", text)
            assert match is not None, text
            waits.append(float(match[1]))
            lookup = await (await gateway.get(f"/operations/die-{n}")).json()
            assert lookup["state"] == "released", lookup
            await asyncio.sleep(float(match[1]))
    assert waits == sorted(waits), waits
    assert waits[-1] > waits[0], waits


async def test_a_probes_not_found_releases_only_with_shared_state(
    gateway_factory: GatewayFactory, tmp_path: Path
) -> None:
    """A child killed before the call reached the tool: the probe finds nothing. Without
    `shared_state` that is evidence only (verdict `not-shared`, the call stays
    `unknown`): another child cannot vouch for the one that took the call."""
    gateway = await stdio_gateway(
        gateway_factory, tmp_path, probe={**PROBE, "not_applied_after": "0s"}, max_call="1s"
    )
    url = gateway.url + PREFIX
    async with asyncio.timeout(TIMEOUT):
        # The effect's line is removed first: as if the tool had not applied it yet.
        await kill_the_child_mid_call(url, tmp_path, "k-ns", forget_the_effect=True)
        await whoami(url)  # a new child
        lookup = await (await gateway.get("/operations/k-ns")).json()
        async with asyncio.timeout(TIMEOUT):
            while True:
                operation = await admin_json(
                    gateway, f"/admin/operations/{lookup['id']}/probe", "POST"
                )
                probes = [e for e in operation["history"] if e["type"] == "probe"]
                if probes and probes[-1]["verdict"] == "not-shared":
                    break
                await asyncio.sleep(0.2)  # the window (max_call, then the lease) closes
    assert operation["state"] == "unknown", operation
    assert "shared_state" in probes[-1]["detail"]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for every purpose here (its parent, the killed gateway, is gone too).
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/stat").read_text().split(") ")[-1].startswith("Z"):
            return False
    return True


async def test_a_gateway_killed_mid_call_leaves_it_unknown_and_its_child_ends(
    processes: list[GatewayProcess], tmp_path: Path
) -> None:
    """kill -9 of the gateway while its child runs a call: the child, its stdin closed,
    ends (no orphan keeps running tools); after a restart the call is `unknown` (its
    lease ran out), the retry is told so, and the tool ran once."""
    options: dict[str, Any] = {
        "extra_routes": [stdio_route(tmp_path)],
        "idempotency": {"lease": "1s"},
    }
    first = spawn(processes, tmp_path, UNUSED, **options)
    async with asyncio.timeout(300):  # two gateway starts on a loaded machine
        with pytest.raises(BaseException):  # noqa: B017, PT011, PT012 (the gateway vanished)
            async with mcp_client(first.url + PREFIX) as client:
                call = asyncio.create_task(
                    call_with_key(client, "slow_ticket", {"title": "g", "seconds": 120}, "gw-kill")
                )
                started = await started_call(tmp_path)
                first.kill()
                await call
        while alive(started["pid"]):  # noqa: ASYNC110 (the child's own exit is the event)
            await asyncio.sleep(0.05)

        second = spawn(processes, tmp_path, UNUSED, name="gw2", **options)
        await asyncio.sleep(1.2)  # past the dead holder's lease
        async with mcp_client(second.url + PREFIX) as client:
            retry = await call_with_key(
                client, "slow_ticket", {"title": "g", "seconds": 120}, "gw-kill"
            )
    assert retry.is_error is True
    assert (retry.meta or {})["idempotency"]["type"].endswith("outcome-unknown"), retry.meta
    assert len(effects(tmp_path)) == 1


async def test_each_worker_has_its_own_child(
    processes: list[GatewayProcess], tmp_path: Path
) -> None:
    """With `[server] workers = 2`, each worker starts and speaks to its own child: a
    child's parent is the worker that serves it, and no worker has two (one scope)."""
    gateway = spawn(
        processes, tmp_path, UNUSED, extra_routes=[stdio_route(tmp_path)],
        server={"workers": 2},
    )  # fmt: skip
    assert gateway.process is not None
    workers = set(await wait_for_workers(gateway.process.pid, 2, seconds=60))
    children: dict[int, set[int]] = {}
    async with asyncio.timeout(120):
        for _ in range(16):  # new connections: the kernel spreads them over both workers
            seen = await whoami(gateway.url + PREFIX)
            children.setdefault(seen["ppid"], set()).add(seen["pid"])
            if len(children) == 2:
                break
    assert set(children) == workers, (children, workers)
    assert all(len(pids) == 1 for pids in children.values()), children


async def test_the_status_tool_and_the_similar_guard_work_on_a_stdio_route(
    gateway_factory: GatewayFactory, tmp_path: Path
) -> None:
    """The gateway's own status tool answers for a stdio route's calls, and the same call
    under a new key is refused (`similar_guard = "all"`) without reaching the child."""
    gateway = await stdio_gateway(
        gateway_factory, tmp_path, status_tool="operation_status", similar_guard="all"
    )
    url = gateway.url + PREFIX
    async with asyncio.timeout(TIMEOUT), mcp_client(url) as client:
        tools = [tool.name for tool in (await client.list_tools()).tools]
        assert "operation_status" in tools
        await call_with_key(client, "create_ticket", {"title": "s"}, "st-1")
        status = await client.call_tool("operation_status", {"key": "st-1"})
        again = await call_with_key(client, "create_ticket", {"title": "s"}, "st-2")
    assert (status.structured_content or {}).get("state") == "completed", status
    assert again.is_error
    assert (again.meta or {})["idempotency"]["type"].endswith("similar-operation"), again.meta
    assert len(effects(tmp_path)) == 1


def test_a_stdio_routes_settings_are_checked() -> None:
    """`command` or `upstream`, not both; the stdio keys only with a command; `${VAR}` in
    `env` from the environment; a program that cannot be found is a warning."""
    base = {"name": "fs", "prefix": "/fs", "kind": "mcp"}
    route = RouteSettings.model_validate(
        {**base, "command": ["prog", "--flag"], "env": {"TOKEN": "${STDIO_T}"}},
        context={"environ": {"STDIO_T": "t0k"}},
    )
    assert (route.command, route.env) == (("prog", "--flag"), {"TOKEN": "t0k"})
    for bad, where in (
        ({**base, "command": ["prog"], "upstream": "http://127.0.0.1:1"}, "command"),
        ({**base, "upstream": "http://127.0.0.1:1", "shared_tenants": True}, "shared_tenants"),
        ({**base, "command": []}, "command"),
        ({**base, "command": ["prog"], "env": {"BAD-NAME": "x"}}, "env"),
        ({"name": "h", "prefix": "/h", "command": ["prog"]}, "command"),
    ):
        with pytest.raises(ValidationError) as refused:
            RouteSettings.model_validate(bad, context={"environ": {}})
        assert where in str(refused.value), (bad, refused.value)
    settings = Settings.model_validate({"routes": [{**base, "command": ["no-such-program-x"]}]})
    assert any("no-such-program-x" in warning for warning in settings.warnings())


async def test_a_silent_child_past_the_routes_timeout_leaves_the_call_unknown(
    gateway_factory: GatewayFactory, tmp_path: Path
) -> None:
    """A child that says nothing for the route's `timeout` while a call runs: the call is
    `unknown` (`upstream-timeout`: it was sent, and may have run), never failed."""
    gateway = await stdio_gateway(gateway_factory, tmp_path, timeout="500ms")
    async with asyncio.timeout(TIMEOUT), mcp_client(gateway.url + PREFIX) as client:
        result = await call_with_key(
            client, "slow_ticket", {"title": "quiet", "seconds": 30}, "k-quiet"
        )
    said = dict(result.meta or {})["idempotency"]
    assert said["type"].endswith("upstream-timeout"), said
    lookup = await (await gateway.get("/operations/k-quiet")).json()
    assert lookup["state"] == "unknown"
    assert len(effects(tmp_path)) == 1


async def test_a_paused_child_leaves_its_call_unknown_and_its_late_answer_makes_no_second(
    gateway_factory: GatewayFactory, tmp_path: Path
) -> None:
    """SIGSTOP of the child mid-call: silent past the route's timeout, the call is
    `unknown` and its retry is refused; resumed (SIGCONT), the child's late answer does not
    make the tool run again. One effect."""
    gateway = await stdio_gateway(gateway_factory, tmp_path, timeout="500ms")
    url = gateway.url + PREFIX
    async with asyncio.timeout(TIMEOUT), mcp_client(url) as client:
        call = asyncio.create_task(
            call_with_key(client, "slow_ticket", {"title": "p", "seconds": 0.2}, "k-pause")
        )
        started = await started_call(tmp_path)
        os.kill(started["pid"], signal.SIGSTOP)
        try:
            first = await call
        finally:
            os.kill(started["pid"], signal.SIGCONT)
        retry = await call_with_key(
            client, "slow_ticket", {"title": "p", "seconds": 0.2}, "k-pause"
        )
    assert dict(first.meta or {})["idempotency"]["type"].endswith("upstream-timeout")
    assert dict(retry.meta or {})["idempotency"]["type"].endswith("outcome-unknown")
    assert len(effects(tmp_path)) == 1


async def test_past_max_children_the_idlest_child_stops_and_a_busy_one_is_kept(
    gateway_factory: GatewayFactory, tmp_path: Path
) -> None:
    """`max_children = 1`: a second scope's call stops the first scope's idle child and
    gets a child of its own; while that child runs a call, a third scope's call is refused
    as not made (`upstream-unreachable`: the key released), and the running call ends."""
    gateway = await gateway_factory(
        UNUSED,
        extra_routes=[stdio_route(tmp_path, max_children=1)],
        idempotency={"shared_scope": False},
    )
    url = gateway.url + PREFIX
    agent = {n: {"Authorization": f"Bearer agent-{n}-credential"} for n in (1, 2, 3)}
    async with asyncio.timeout(TIMEOUT):
        first = (await whoami(url, agent[1]))["pid"]
        async with mcp_client(url, headers=agent[2]) as busy:
            call = asyncio.create_task(
                call_with_key(busy, "slow_ticket", {"title": "b", "seconds": 2}, "k-busy")
            )
            second = (await started_call(tmp_path))["pid"]
            # 2026-07-28: no initialize, which no child could answer either.
            async with mcp_client(url, headers=agent[3], mode=MODERN) as third:
                refused = await call_with_key(third, "create_ticket", {"title": "c"}, "k-third")
            answered = await call
    assert second != first
    assert not alive(first), "the idle child made room"
    said = dict(refused.meta or {})["idempotency"]
    assert said["type"].endswith("upstream-unreachable"), said
    assert "max_children" in said["detail"]
    assert not answered.is_error
    assert [effect["key"] for effect in effects(tmp_path)] == [
        (await (await gateway.get("/operations/k-busy", headers=agent[2])).json())["id"]
    ]
