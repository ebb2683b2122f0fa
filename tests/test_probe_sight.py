"""A probe proves it can see before its "not found" releases anything (third round).

A probe's "not found" is the only machine verdict that releases a key, and a
released key is sent again. The reviews found it releasing effects it could
not see: the demo's tickets probe released a sent email (the route covers
`/v1/emails`, the probe looks tickets up), and a probe asking as the route's
principal read "not found" about another account's effect. These tests run
real gateways in front of real tools and count the effects there.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import ToolAPI
from harness import (
    ADMIN_TOKEN,
    ROOT,
    RunningGateway,
    calibration_sample,
    settings_for,
    write_config,
)
from pydantic import ValidationError
from upstream import CountingUpstream, effects_probe

from gateway.cli import main as cli_main
from gateway.config import DEFAULT_CONFIG_PATH, Settings, load_settings

GatewayFactory = Any
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
LIMIT = 60.0
"""Seconds before a wait is taken for a hang: only a broken gateway comes near it."""


async def admin(
    gateway: RunningGateway, method: str, path: str, body: Any = None
) -> tuple[int, Any]:
    assert gateway.admin_url is not None
    async with gateway.session.request(
        method, gateway.admin_url + path, json=body, headers=ADMIN
    ) as response:
        return response.status, await response.json(content_type=None)


async def lookup(gateway: RunningGateway, key: str, headers: dict[str, str] | None = None) -> Any:
    async with gateway.session.get(f"{gateway.url}/operations/{key}", headers=headers) as found:
        assert found.status == 200, await found.text()
        return await found.json()


async def probe_now(gateway: RunningGateway, key: str) -> dict[str, Any]:
    """`POST /admin/operations/{id}/probe` (the console's Probe now): the operation after."""
    document = await lookup_admin(gateway, key)
    status, probed = await admin(gateway, "POST", f"/admin/operations/{document['id']}/probe")
    assert status == 200, probed
    result: dict[str, Any] = probed
    return result


async def lookup_admin(gateway: RunningGateway, key: str) -> dict[str, Any]:
    status, found = await admin(gateway, "GET", f"/admin/operations?key={key}")
    assert status == 200, found
    [item] = found["items"]
    status, document = await admin(gateway, "GET", f"/admin/operations/{item['id']}")
    assert status == 200, document
    result: dict[str, Any] = document
    return result


def probes_of(operation: dict[str, Any]) -> list[dict[str, Any]]:
    return [event for event in operation["history"] if event["type"] == "probe"]


def demo_tickets_route(tool_url: str) -> dict[str, Any]:
    """The tickets route of config/gateway.toml (what `make run` serves), its probe and
    `applies_to` as shipped, pointed at a test's tool API, with a short timeout and grace."""
    demo = load_settings(ROOT / DEFAULT_CONFIG_PATH, environ={}).routes[0]
    route = demo.model_dump(exclude={"name", "prefix", "upstream", "timeout"})
    assert route["probe"] is not None
    route["probe"] = {**route["probe"], "not_applied_after": "1s"}
    return {**route, "upstream": tool_url, "timeout": "1s"}


async def test_the_demo_probe_does_not_release_a_sent_email(
    gateway_factory: GatewayFactory, tool_api: ToolAPI
) -> None:
    """The demo's tickets route also sends emails, which its probe (a ticket lookup) never
    finds: an email that timed out and was sent late stays `unknown` however often the
    probe answers 404, the history says why in words and shows what the probe asked, the
    retry is refused, and an operator settles it; one email, ever."""
    gateway = await gateway_factory(
        tool_api.url,
        route=demo_tickets_route(tool_api.url),
        idempotency={"lease": "1s", "sweep_interval": "1h"},
        admin={"token": ADMIN_TOKEN},
    )
    await calibration_sample(gateway.session, gateway.url)  # the probe sees tickets: calibrated
    email = {"to": "ops@example.com", "subject": "Printer on fire"}
    sent = await gateway.post("/tickets/v1/emails?delay=2", key="mail-1", json_body=email)
    assert sent.status == 504
    async with asyncio.timeout(LIMIT):
        while not tool_api.state.emails:  # noqa: ASYNC110 (the tool's state has no event)
            await asyncio.sleep(0.05)  # the tool sends it late, after the gateway gave up
    # Past the window (lease 1 s, timeout 1 s, grace 1 s): were the probe's 404 about
    # emails believed, this probe would release the key.
    await asyncio.sleep(3.2)

    probed = await probe_now(gateway, "mail-1")

    assert probed["state"] == "unknown", probed
    [verdict] = probes_of(probed)
    assert verdict["verdict"] == "not-declared"
    assert "not declared for POST /v1/emails" in verdict["detail"]
    assert "Check the tool by hand" in verdict["detail"]
    asked = verdict["probe"]["request"]
    assert asked["method"] == "GET"
    assert asked["path"] == f"/v1/issues?idempotency_key={probed['id']}"
    assert verdict["probe"]["answer"]["status"] == 404
    retry = await gateway.post("/tickets/v1/emails?delay=2", key="mail-1", json_body=email)
    assert retry.status == 409
    assert len(tool_api.state.emails) == 1

    status, settled = await admin(
        gateway,
        "POST",
        f"/admin/operations/{probed['id']}/resolve",
        {
            "outcome": "applied",
            "response": {"status": 202, "headers": {}, "body": '{"id": "E-1"}'},
            "note": "E-1 is in the mail log",
        },
    )
    assert (status, settled["state"]) == (200, "completed"), settled
    replay = await gateway.post("/tickets/v1/emails?delay=2", key="mail-1", json_body=email)
    assert replay.status == 202
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert len(tool_api.state.emails) == 1


async def test_a_probe_declared_for_tickets_still_releases_a_ticket_never_made(
    gateway_factory: GatewayFactory, tool_api: ToolAPI
) -> None:
    """The same route and probe release a ticket request the tool never applied (refused
    as malformed, unseen by the gateway... here: dropped before the tool applied it), once
    the window passed and the probe is calibrated on a ticket it can find."""
    gateway = await gateway_factory(
        tool_api.url,
        route=demo_tickets_route(tool_api.url),
        idempotency={"lease": "1s", "sweep_interval": "1h"},
        admin={"token": ADMIN_TOKEN},
    )
    await calibration_sample(gateway.session, gateway.url)
    # `delay` past the gateway's patience, and a title the API refuses: no ticket is made.
    bad = {"title": 7}
    lost = await gateway.post("/tickets/v1/issues?delay=1.5", key="t-1", json_body=bad)
    assert lost.status == 504
    await asyncio.sleep(3.2)  # past the window: lease 1 s, timeout 1 s, grace 1 s

    released = await probe_now(gateway, "t-1")

    assert released["state"] == "released", released
    assert released["resolution"]["by"] == "probe"
    assert len(tool_api.state.issues) == 1  # the calibration sample only


async def test_a_probe_that_cannot_find_a_completed_effect_is_blind_until_trusted(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """Calibration asks the probe about a completed operation of the same kind: a probe
    that does not find it is blind for that kind (probe-blind in the history, the metric,
    `probes show`), releases nothing of it, and is re-enabled only by an operator's trust,
    with a note (an override while the calibration still fails)."""
    gateway = await gateway_factory(
        upstream.url,
        route={"probe": effects_probe(not_applied_after="0s"), "timeout": "1s"},
        idempotency={"lease": "1s", "sweep_interval": "1h"},
        admin={"token": ADMIN_TOKEN},
    )
    lost = await gateway.post("/tickets/v1/issues?drop=before_effect", key="b-1", json_body={})
    assert lost.status == 502
    # Something of the kind completed since (with no grace, a sample must be that recent)...
    await calibration_sample(gateway.session, gateway.url)
    upstream.effects.clear()  # ...but the upstream's lookup lost its records: it sees nothing
    await asyncio.sleep(2.2)  # past the window: lease 1 s, timeout 1 s

    probed = await probe_now(gateway, "b-1")

    assert probed["state"] == "unknown", probed
    blind = [event for event in probed["history"] if event["type"] == "probe-blind"]
    assert len(blind) == 1, json.dumps(probed["history"], indent=1)
    assert blind[0]["kind"] == "POST /*/issues"
    assert blind[0]["applies_to"] == "POST /v1/issues"
    assert "the probe did not find operation" in blind[0]["detail"]
    assert blind[0]["calibration"]["sample"].startswith("op_")  # the operator's view
    owner = await lookup(gateway, "b-1")
    owner_blind = [event for event in owner["history"] if event["type"] == "probe-blind"]
    assert "calibration" not in owner_blind[0]  # never an owner's to see
    status, shown = await admin(gateway, "GET", "/admin/probes/tickets")
    assert status == 200
    assert [(kind["kind"], kind["state"]) for kind in shown["kinds"]] == [
        ("POST /*/issues", "blind")
    ]
    async with gateway.session.get(gateway.url + "/metrics") as metrics:
        text = await metrics.text()
    assert (
        'idempotency_gateway_probe_blind{applies_to="POST /v1/issues",route="tickets"} 1.0' in text
    )
    # Blind stays blind: a later probe does not calibrate again, nor release.
    again = await probe_now(gateway, "b-1")
    assert again["state"] == "unknown"

    status, trusted = await admin(
        gateway,
        "POST",
        "/admin/probes/tickets/trust",
        {"kind": "POST /*/issues", "note": "lookup index restored from backup"},
    )
    assert status == 200, trusted
    assert trusted["state"] == "trusted"  # the calibration still fails: an override, 24 h
    assert trusted["note"] == "lookup index restored from backup"
    assert trusted["trusted_until"] is not None
    released = await probe_now(gateway, "b-1")
    assert released["state"] == "released", released
    assert upstream.count == 0


async def test_a_probe_with_no_calibration_sample_releases_nothing(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """With nothing of the kind completed (in the caller's scope, recently enough) to
    calibrate against, a "not found" is evidence only and says so."""
    gateway = await gateway_factory(
        upstream.url,
        route={"probe": effects_probe(not_applied_after="0s"), "timeout": "1s"},
        idempotency={"lease": "1s", "sweep_interval": "1h"},
        admin={"token": ADMIN_TOKEN},
    )
    lost = await gateway.post("/tickets/v1/issues?drop=before_effect", key="n-1", json_body={})
    assert lost.status == 502
    await asyncio.sleep(2.2)  # past the window

    probed = await probe_now(gateway, "n-1")

    assert probed["state"] == "unknown"
    [verdict] = probes_of(probed)
    assert verdict["verdict"] == "not-calibrated"
    assert "no operation of kind POST /*/issues" in verdict["detail"]


async def test_a_probe_answering_found_for_any_key_is_blind(
    gateway_factory: GatewayFactory, upstream_factory: Any, tmp_path: Path
) -> None:
    """Calibration also asks about a forwarded key never used: a probe that answers
    "found" for it cannot tell effects apart, and is blind."""
    upstream = await upstream_factory()
    route = {
        "timeout": "1s",
        "probe": {**effects_probe(not_applied_after="0s"), "path": "/v1/stats?x={forwarded_key}"},
    }
    gateway = await gateway_factory(
        upstream.url,
        route=route,
        idempotency={"lease": "1s", "sweep_interval": "1h"},
        admin={"token": ADMIN_TOKEN},
    )
    await calibration_sample(gateway.session, gateway.url)
    status, checked = await admin(gateway, "POST", "/admin/probes/tickets/check")
    assert status == 200, checked
    [row] = checked["results"]
    assert row["verdict"] == "blind", row
    assert "never used" in row["detail"]


async def test_probes_check_prints_kind_verdict_and_operation(
    gateway_factory: GatewayFactory, upstream: CountingUpstream, tmp_path: Path
) -> None:
    """`idempotency-gateway probes check ROUTE` calibrates every kind of the route now and
    prints a table (kind, verdict, operation used); a kind the probe is not declared for
    says so; `probes show` prints the rows."""
    gateway = await gateway_factory(
        upstream.url,
        route={"probe": effects_probe(), "timeout": "1s"},
        admin={"token": ADMIN_TOKEN},
    )
    sample = await calibration_sample(gateway.session, gateway.url)
    other = await gateway.post("/tickets/v1/emails", key="e-1", json_body={"to": "x"})
    assert other.status == 201
    sample_id = (await lookup(gateway, sample))["id"]
    assert gateway.admin_url is not None
    args = ["--url", gateway.admin_url, "--token", ADMIN_TOKEN]

    def run(*words: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gateway", *words, *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )

    checked = await asyncio.to_thread(run, "probes", "check", "tickets")
    assert checked.returncode == 0, checked.stderr
    lines = checked.stdout.splitlines()
    assert lines[0].split() == ["KIND", "VERDICT", "OPERATION", "DETAIL"]
    issues = next(line for line in lines if line.startswith("POST /*/issues"))
    assert "calibrated" in issues, checked.stdout
    assert sample_id in issues, checked.stdout
    emails = next(line for line in lines if line.startswith("POST /*/emails"))
    assert "not-declared" in emails, checked.stdout
    shown = await asyncio.to_thread(run, "probes", "show", "tickets")
    assert shown.returncode == 0, shown.stderr
    assert "POST /*/issues" in shown.stdout
    assert "calibrated" in shown.stdout


async def test_a_probe_asking_as_another_principal_releases_nothing(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """An upstream that shows each account only its own records, behind a route that
    passes each caller's own credential on: even with `sees_all_callers = true` (wrongly),
    calibration asks the probe about the caller's own completed effect, the probe (asking
    as the route) does not find it, and nothing of the kind is released: the agent's retry
    of a call that happened is refused, never sent."""
    upstream.per_principal = True
    gateway = await gateway_factory(
        upstream.url,
        route={
            "probe": {
                **effects_probe(not_applied_after="0s"),
                "headers": {"Authorization": "Bearer probe"},
            },
            "timeout": "1s",
        },
        idempotency={"lease": "1s", "sweep_interval": "1h", "shared_scope": False},
        admin={"token": ADMIN_TOKEN},
    )
    alice = {"Authorization": "Bearer alice"}
    applied = await gateway.post(
        "/tickets/v1/issues?drop=after_effect", key="p-1", json_body={"n": 1}, headers=alice
    )
    assert applied.status == 502  # the effect happened; its answer was lost
    await calibration_sample(gateway.session, gateway.url, headers=alice)  # after: no grace
    await asyncio.sleep(2.2)  # past the window

    probed = await lookup(gateway, "p-1", headers=alice)  # a lookup probes when due
    async with asyncio.timeout(LIMIT):  # a verdict: blind, or (the defect) a release
        while probed["state"] == "unknown" and not any(
            e["type"] == "probe-blind" for e in probed["history"]
        ):
            await asyncio.sleep(0.2)
            probed = await lookup(gateway, "p-1", headers=alice)
    assert probed["state"] == "unknown", probed
    retry = await gateway.post(
        "/tickets/v1/issues?drop=after_effect", key="p-1", json_body={"n": 1}, headers=alice
    )
    assert retry.status == 409
    assert upstream.count_for((await lookup(gateway, "p-1", headers=alice))["id"]) == 1


def test_check_config_refuses_a_probe_that_may_ask_as_another_principal(tmp_path: Path) -> None:
    """With scopes from callers' credentials passed on upstream, a probe asks as the route:
    `check-config` refuses it, naming the route, unless the probe says it sees every
    caller (`sees_all_callers`) or the route sets the credential itself."""
    text = (
        '[[routes]]\nname = "ledger"\nprefix = "/ledger"\nupstream = "http://127.0.0.1:9000"\n'
        "[routes.probe]\npath = '/v1/entries?ref={forwarded_key}'\n"
        'applies_to = ["POST /v1/entries"]\n'
    )
    config = tmp_path / "gateway.toml"
    config.write_text(text)
    refused = subprocess.run(
        [sys.executable, "-m", "gateway", "check-config", "--config", str(config)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert refused.returncode == 2, refused.stdout
    assert "routes[0].probe.sees_all_callers" in refused.stderr
    assert 'route "ledger" passes each caller\'s own Authorization upstream' in refused.stderr
    config.write_text(text + "sees_all_callers = true\n")
    assert cli_main(["check-config", "--config", str(config)]) == 0
    config.write_text(
        text.replace(
            "[routes.probe]",
            '[routes.upstream_headers]\nAuthorization = "Bearer ledger-probe"\n[routes.probe]',
        )
    )
    assert cli_main(["check-config", "--config", str(config)]) == 0


def test_check_config_warns_about_a_probe_with_no_applies_to(
    tmp_path: Path, upstream: CountingUpstream, capsys: Any
) -> None:
    """A probe with no `applies_to` never releases: check-config says so, naming the route,
    and still validates."""
    probe = {key: value for key, value in effects_probe().items() if key != "applies_to"}
    settings = settings_for(tmp_path, upstream.url, route={"probe": probe})
    config = write_config(settings, tmp_path / "gateway.toml")
    assert cli_main(["check-config", "--config", str(config)]) == 0
    warned = capsys.readouterr().err
    assert 'warning: route "tickets": its probe has no applies_to' in warned


def test_applies_to_entries_are_checked() -> None:
    """`applies_to` entries are "METHOD /path" on HTTP routes (no query, no dot segments,
    `*` for a whole segment) and tool names on MCP routes; mistakes name the key."""

    def routes(probe: dict[str, Any], kind: str = "http") -> Any:
        route: dict[str, Any] = {
            "name": "r",
            "prefix": "/r",
            "upstream": "http://127.0.0.1:9",
            "kind": kind,
            "probe": {**probe, "sees_all_callers": True},
        }
        return Settings.model_validate({"routes": [route]})

    http = {"path": "/x/{forwarded_key}"}
    mcp = {"tool": "find", "arguments": {"k": "{forwarded_key}"}, "applied_pointer": "/f"}
    assert routes({**http, "applies_to": ["post /v1/items/*/notes"]}).routes[0].applies_to()
    assert routes({**mcp, "applies_to": ["create_ticket"]}, kind="mcp")
    for bad, said in (
        ("/v1/items", 'write "METHOD /path"'),
        ("POST v1/items", "must start with '/'"),
        ("POST /v1/items?x=1", "no query"),
        ("POST /v1/../items", "dot segments"),
        ("POST /v1/it*ms", "one whole segment"),
    ):
        with pytest.raises(ValidationError) as refused:
            routes({**http, "applies_to": [bad]})
        assert "probe.applies_to[0]" in str(refused.value), bad
        assert said in str(refused.value), (bad, str(refused.value))


async def test_a_kind_another_worker_found_blind_is_not_released_here(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """Calibration rows are shared: a kind another worker or replica found blind (written
    here straight into the store) refuses this process's release, though its probe
    would find the sample."""
    from gateway.engine.calibration import CalibrationChange, CalibrationState
    from gateway.web.appkeys import STORE

    gateway = await gateway_factory(
        upstream.url,
        route={"probe": effects_probe(not_applied_after="0s"), "timeout": "1s"},
        idempotency={"lease": "1s", "sweep_interval": "1h"},
        admin={"token": ADMIN_TOKEN},
    )
    lost = await gateway.post("/tickets/v1/issues?drop=before_effect", key="r-1", json_body={})
    assert lost.status == 502
    await calibration_sample(gateway.session, gateway.url)  # after it: there is no grace
    blind = CalibrationChange(
        "tickets", "POST /*/issues", CalibrationState.BLIND, "calibration", "found nothing"
    )
    assert await gateway.app[STORE].save_calibration(blind) is not None
    await asyncio.sleep(2.2)  # past the window

    probed = await probe_now(gateway, "r-1")

    assert probed["state"] == "unknown"
    assert any(event["type"] == "probe-blind" for event in probed["history"])


async def test_a_redaction_erases_what_the_probes_asked_and_read(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """A probe's exchange is kept as an erasable field of its event: a redaction erases
    it with the request, and the history says so (the verdict and its status stay)."""
    gateway = await gateway_factory(
        upstream.url,
        route={"probe": effects_probe(not_applied_after="1h"), "timeout": "1s"},
        admin={"token": ADMIN_TOKEN},
    )
    lost = await gateway.post("/tickets/v1/issues?drop=before_effect", key="x-1", json_body={})
    assert lost.status == 502
    probed = await probe_now(gateway, "x-1")
    [verdict] = probes_of(probed)
    assert verdict["probe"]["request"]["path"] == f"/effects/{probed['id']}"
    status, redacted = await admin(
        gateway, "POST", f"/admin/operations/{probed['id']}/redact", {"reason": "test"}
    )
    assert status == 200, redacted
    [verdict] = probes_of(redacted)
    assert "probe" not in verdict
    assert verdict["probe_redacted"] is True
    assert verdict["status"] == 404
    assert redacted["history"][-1]["erased"] == ["request", "probes"]
