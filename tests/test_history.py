"""The history of an operation, and settling an unknown one without a second effect.

Real gateways in front of the counting upstream, on SQLite and PostgreSQL:
every state change leaves events that nothing rewrites; a row edited behind
the gateway's back (with sqlite3, with psql) is found by `verify`; a person's
`not_applied` is refused while the tool may still apply the last send; an
operator finds operations by key, id or forwarded key and sees the request.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import sqlite3
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import aiohttp
import pytest
import rfc8785
from conftest import GatewayFactory
from harness import ADMIN_TOKEN, RunningGateway
from hypothesis import given
from hypothesis import strategies as st
from pg import PG_HOST, PG_PORT
from upstream import CountingUpstream, effects_probe

from gateway.engine.history import canonical, chain, event_hash, new_event, verify_chain

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


# -- the chain itself ------------------------------------------------------------------

_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)
_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | _TEXT,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text("abcdefghij_", min_size=1, max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


@given(st.dictionaries(st.text("abcdefghij_", min_size=1, max_size=8), _VALUES, max_size=6))
def test_the_fast_canonical_form_is_rfc_8785_for_event_data(data: dict[str, Any]) -> None:
    """The chain hashes the C encoder's output, and an event's form written out key by key;
    for what events hold both are RFC 8785."""
    assert canonical(data) == rfc8785.dumps(data)
    event = {"actor": "admin:an\u00e9", "at": 17, "data": data, "prev": "ab", "seq": 2,
             "type": "resolved", "version": 3}  # fmt: skip
    expected = hashlib.sha256(rfc8785.dumps(event)).hexdigest()
    text = canonical(data).decode()
    assert event_hash(prev="ab", seq=2, at_us=17, version=3, type="resolved",
                      actor="admin:an\u00e9", data=text) == expected  # fmt: skip


def _chained(count: int = 3, note: str = "found nothing") -> tuple[list[Any], str, int]:
    events = [new_event("claimed", "gateway", {"token": 1})]
    events += [
        new_event("resolved", "admin:ana", {"outcome": "not_applied"}, erasable={"note": note})
    ]
    events += [new_event("released", "gateway", {"detail": "x"})][: count - 2]
    rows, head, seq = chain(
        "op_1", head="", seq=0, version=2, at_us=1_700_000_000_000_000, events=events, attempt=1
    )
    return rows, head, seq


def test_an_intact_chain_verifies_and_an_edit_is_named() -> None:
    rows, head, seq = _chained()
    assert verify_chain(rows, head=head, head_seq=seq).ok

    edited = list(rows)
    edited[1] = edited[1]._replace(data=edited[1].data.replace("not_applied", "applied"))
    report = verify_chain(edited, head=head, head_seq=seq)
    assert (report.ok, report.broken_seq) == (False, 2)

    dropped = rows[:-1]
    report = verify_chain(dropped, head=head, head_seq=seq)
    assert not report.ok
    assert "head" in str(report.reason)


def test_a_missing_payload_is_a_redaction_only_where_a_later_event_erased_it() -> None:
    """A recorded request dropped with a later `redacted` event naming it is a redaction;
    the same drop without one, or an operator's note gone (nothing ever erases notes), is
    an edit; a changed value is an edit too."""
    claimed = new_event("claimed", "gateway", erasable={"request": {"body": "x"}})
    redaction = new_event("redacted", "admin:ana", {"erased": ["request", "probes"]})
    rows, head, seq = chain(
        "op_1", head="", seq=0, version=2, at_us=1_700_000_000_000_000,
        events=[claimed, redaction], attempt=1,
    )  # fmt: skip
    erased = [rows[0]._replace(payload=None), rows[1]]
    report = verify_chain(erased, head=head, head_seq=seq)
    assert (report.ok, report.redacted) == (True, (1,))

    rows, head, seq = chain(
        "op_1", head="", seq=0, version=2, at_us=1_700_000_000_000_000, events=[claimed],
        attempt=1,
    )  # fmt: skip
    report = verify_chain([rows[0]._replace(payload=None)], head=head, head_seq=seq)
    assert (report.ok, report.broken_seq) == (False, 1)
    assert "request is gone" in str(report.reason)

    rows, head, seq = _chained()
    erased = list(rows)
    erased[1] = erased[1]._replace(payload=None)
    report = verify_chain(erased, head=head, head_seq=seq)
    assert (report.ok, report.broken_seq) == (False, 2)
    assert "note is gone" in str(report.reason)

    changed = list(rows)
    assert changed[1].payload is not None
    changed[1] = changed[1]._replace(
        payload=changed[1].payload.replace(b"found nothing", b"found it")
    )
    report = verify_chain(changed, head=head, head_seq=seq)
    assert (report.ok, report.broken_seq) == (False, 2)


# -- through a gateway -------------------------------------------------------------------


async def _admin(
    gateway: RunningGateway, method: str, path: str, body: Any = None, **headers: str
) -> tuple[int, Any, aiohttp.ClientResponse]:
    assert gateway.admin_url is not None
    async with gateway.session.request(
        method, gateway.admin_url + path, json=body, headers={**ADMIN, **headers}
    ) as response:
        raw = await response.read()
        return response.status, json.loads(raw) if raw else None, response


async def _by_key(gateway: RunningGateway, key: str) -> dict[str, Any]:
    status, page, _ = await _admin(gateway, "GET", f"/admin/operations?key={key}")
    assert status == 200, page
    assert len(page["items"]) == 1, page
    status, document, _ = await _admin(
        gateway, "GET", f"/admin/operations/{page['items'][0]['id']}"
    )
    assert status == 200
    return dict(document)


def _types(document: dict[str, Any]) -> list[str]:
    return [event["type"] for event in document["history"]]


async def _guarded(
    gateway_factory: GatewayFactory, upstream: CountingUpstream, **options: Any
) -> RunningGateway:
    # Every call but a held one answers within the whole-call limit, however loaded the machine.
    route = {"timeout": "1s", **options.pop("route", {})}
    return await gateway_factory(upstream.url, route=route, admin={"token": ADMIN_TOKEN}, **options)


async def test_the_two_refund_story_ends_with_one_refund(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """A paused tool applies the first send after the gateway's timeout: an operator who
    releases it early is refused (too-early), so the agent's retry is never sent."""
    gateway = await _guarded(gateway_factory, upstream)
    first = await gateway.post("/tickets/v1/refunds?hold=1", key="r-1", json_body={"amount": 5})
    assert first.status == 504
    operation = await _by_key(gateway, "r-1")
    assert operation["state"] == "unknown"
    assert operation["last_send_age"] is not None
    assert operation["may_apply_until"] is not None

    # The operator checks the refund list, sees nothing yet, and releases it.
    status, problem, response = await _admin(
        gateway, "POST", f"/admin/operations/{operation['id']}/resolve",
        {"outcome": "not_applied", "note": "no refund in the list"},
    )  # fmt: skip
    assert status == 409, problem
    assert problem["type"].endswith("/too-early"), problem
    assert int(response.headers["Retry-After"]) >= 1
    assert problem["allowed_at"] == operation["may_apply_until"]
    assert "force" not in problem["detail"]

    upstream.release_held()  # the tool wakes and applies the first send
    await upstream.wait_for_effects(1)
    retry = await gateway.post("/tickets/v1/refunds?hold=1", key="r-1", json_body={"amount": 5})
    assert retry.status == 409  # outcome-unknown: not sent again
    status, settled, _ = await _admin(
        gateway, "POST", f"/admin/operations/{operation['id']}/resolve",
        {"outcome": "applied", "note": "refund R-1 is there now",
         "response": {"status": 201, "body": '{"refund": "R-1"}'}},
        **{"X-Admin-Actor": "ana"},
    )  # fmt: skip
    assert status == 200
    assert settled["state"] == "completed"
    assert settled["receipt_source"] == "operator"
    replay = await gateway.post("/tickets/v1/refunds?hold=1", key="r-1", json_body={"amount": 5})
    assert replay.status == 201
    assert await replay.read() == b'{"refund": "R-1"}'
    assert upstream.count == 1
    resolved = [e for e in settled["history"] if e["type"] == "resolved"]
    assert resolved[-1]["actor"] == "admin:ana"
    assert resolved[-1]["note"] == "refund R-1 is there now"


async def test_a_forced_release_is_recorded_and_its_note_outlives_the_retry(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """The operator's decision and note stay in the history after the retry completed;
    the owner sees that an admin settled it, not who, nor the unshared note."""
    gateway = await _guarded(gateway_factory, upstream)
    assert (
        await gateway.post("/tickets/v1/t?drop=after_effect", key="f-1", json_body={})
    ).status == 502
    operation = await _by_key(gateway, "f-1")

    status, released, _ = await _admin(
        gateway, "POST", f"/admin/operations/{operation['id']}/resolve",
        {"outcome": "not_applied", "note": "ticket list checked: none", "force": True},
        **{"X-Admin-Actor": "ana"},
    )  # fmt: skip
    assert status == 200
    assert released["state"] == "released"
    retry = await gateway.post("/tickets/v1/t", key="f-1", json_body={})
    assert retry.status == 422  # another path: still bound to the first request
    retry = await gateway.post("/tickets/v1/t?drop=after_effect", key="f-1", json_body={})
    assert retry.status == 502
    await upstream.wait_for_effects(2)

    after = await _by_key(gateway, "f-1")
    types = _types(after)
    assert types[:3] == ["claimed", "sent", "connection-lost"]
    assert types[3:6] == ["resolved", "released", "claimed"]
    resolved = after["history"][3]
    assert resolved["force"] is True
    assert resolved["note"] == "ticket list checked: none"
    assert resolved["actor"] == "admin:ana"
    assert [e["seq"] for e in after["history"]] == list(range(1, len(types) + 1))

    owner = await gateway.get("/operations/f-1")
    mine = await owner.json()
    seen = next(e for e in mine["history"] if e["type"] == "resolved")
    assert seen["actor"] == "an operator"
    assert "note" not in seen
    assert "request" not in mine


async def test_an_owner_may_not_force(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    gateway = await _guarded(gateway_factory, upstream)
    assert (
        await gateway.post("/tickets/v1/t?drop=after_effect", key="o-1", json_body={})
    ).status == 502
    response = await gateway.session.post(
        f"{gateway.url}/operations/o-1/resolve", json={"outcome": "not_applied", "force": True}
    )
    assert response.status == 400
    response = await gateway.session.post(
        f"{gateway.url}/operations/o-1/resolve", json={"outcome": "not_applied"}
    )
    problem = await response.json()
    assert response.status == 409
    assert problem["type"].endswith("/too-early")
    assert "force" not in json.dumps(problem)


async def test_an_edited_row_is_found_by_verify_sqlite(
    gateway_factory: GatewayFactory, upstream: CountingUpstream, tmp_path: Path
) -> None:
    gateway = await _guarded(gateway_factory, upstream)
    assert (await gateway.post("/tickets/v1/t", key="v-1", json_body={"n": 1})).status == 201
    operation = await _by_key(gateway, "v-1")
    assert _types(operation) == ["claimed", "sent", "answered"]
    status, report, _ = await _admin(gateway, "GET", f"/admin/operations/{operation['id']}/verify")
    assert status == 200
    assert report["ok"]
    assert report["events"] == 3

    with sqlite3.connect(tmp_path / "gateway.db") as db:
        db.execute(
            "UPDATE operation_events SET data = replace(data, '201', '200') "
            "WHERE operation_id = ? AND seq = 3",
            (operation["id"],),
        )
    status, report, _ = await _admin(gateway, "GET", f"/admin/operations/{operation['id']}/verify")
    assert not report["ok"]
    assert report["broken"]["seq"] == 3
    status, everything, _ = await _admin(gateway, "GET", "/admin/verify")
    assert [b["seq"] for b in everything["broken"]] == [3]


async def test_an_edited_row_is_found_by_verify_postgres(
    postgres_url: str, gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    # With a history key: PostgreSQL chains with HMAC too (the key is recorded, signed, once).
    key = base64.b64encode(bytes(range(32))).decode()
    gateway = await _guarded(
        gateway_factory, upstream, store_url=postgres_url, store={"history_key": key}
    )
    assert (await gateway.post("/tickets/v1/t", key="v-2", json_body={"n": 2})).status == 201
    operation = await _by_key(gateway, "v-2")
    assert _types(operation) == ["claimed", "sent", "answered"]
    _, report, _ = await _admin(gateway, "GET", f"/admin/operations/{operation['id']}/verify")
    assert report["ok"], report

    schema = parse_qs(urlsplit(postgres_url).query)["search_path"][0]
    await asyncio.to_thread(
        subprocess.run,
        ["psql", "-h", PG_HOST, "-p", str(PG_PORT), "-U", "postgres", "-d", "test", "-v",
         "ON_ERROR_STOP=1", "-c",
         f"UPDATE {schema}.operation_events SET actor = 'someone' "
         f"WHERE operation_id = '{operation['id']}' AND seq = 2"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    _, report, _ = await _admin(gateway, "GET", f"/admin/operations/{operation['id']}/verify")
    assert not report["ok"]
    assert report["broken"]["seq"] == 2


async def test_search_by_prefix_takes_wildcards_literally_and_finds_forwarded_keys(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    gateway = await _guarded(gateway_factory, upstream, route={"forward_key": "scoped"})
    for key in ("run%_1:a", "runx1:a", "other"):
        assert (await gateway.post("/tickets/v1/t", key=key, json_body={})).status == 201
    _, page, _ = await _admin(gateway, "GET", "/admin/operations?q=run%25_")
    assert [item["key"] for item in page["items"]] == ["run%_1:a"]
    _, page, _ = await _admin(gateway, "GET", "/admin/operations?q=RUN")
    assert page["items"] == []  # keys are case-sensitive
    forwarded = upstream.effects[-1].key
    assert forwarded is not None
    assert forwarded.endswith(":other")
    _, page, _ = await _admin(gateway, "GET", f"/admin/operations?q={forwarded[:-2]}")
    assert [item["key"] for item in page["items"]] == ["other"]
    op_id = page["items"][0]["id"]
    _, page, _ = await _admin(gateway, "GET", f"/admin/operations?q={op_id[:-3]}")
    assert op_id in [item["id"] for item in page["items"]]


async def test_the_request_is_recorded_without_secrets_and_erased_by_redaction(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    gateway = await _guarded(gateway_factory, upstream, route={"record_request_max": 256})
    body = {"amount": 5, "card": {"token": "tok_live_1"}}
    sent = await gateway.post("/tickets/v1/refunds?api_key=k3y&x=1", key="q-1", json_body=body)
    assert sent.status == 201
    operation = await _by_key(gateway, "q-1")
    recorded = operation["request"]
    assert recorded["method"] == "POST"
    assert recorded["target"] == "/tickets/v1/refunds?api_key=%5Bredacted%5D&x=1"
    assert json.loads(recorded["body"]) == {"amount": 5, "card": {"token": "[redacted]"}}
    kept = json.dumps([recorded, operation["history"]])  # the receipt is the tool's own
    assert "k3y" not in kept
    assert "tok_live_1" not in kept

    large = await gateway.post("/tickets/v1/big", key="q-2", data=b"x" * 1000)
    assert large.status == 201
    big = (await _by_key(gateway, "q-2"))["request"]
    assert (big["body"], big["body_gone"], big["size"]) == (None, "too_large", 1000)

    status, redacted, _ = await _admin(
        gateway, "POST", f"/admin/operations/{operation['id']}/redact", {"reason": "GDPR 17"}
    )
    assert status == 200
    assert redacted["request"]["body_gone"] == "redacted"
    assert redacted["history"][-1]["type"] == "redacted"
    status, report, _ = await _admin(gateway, "GET", f"/admin/operations/{operation['id']}/verify")
    assert report["ok"]
    assert report["redacted"] == [1]


async def test_probe_now_and_a_bulk_probe_settle_unknown_operations(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    gateway = await _guarded(
        gateway_factory, upstream, route={"probe": effects_probe(not_applied_after="0s")}
    )
    for key in ("p-1", "p-2", "p-3"):
        drop = "after_effect" if key != "p-3" else "before_effect"
        assert (
            await gateway.post(f"/tickets/v1/t?drop={drop}", key=key, json_body={"k": key})
        ).status == 502
    one = await _by_key(gateway, "p-1")
    assert one["probe_available"] is True
    status, probed, _ = await _admin(gateway, "POST", f"/admin/operations/{one['id']}/probe")
    assert status == 200
    assert probed["state"] == "completed"
    assert probed["receipt_source"] == "probe"
    assert "probe" in _types(probed)

    status, job, _response = await _admin(gateway, "POST", "/admin/operations/probe?route=tickets")
    assert status == 202
    assert job["job"] == "/admin/probe-jobs/tickets"
    for _ in range(600):  # bounded: the job probes two operations
        status, job, _ = await _admin(gateway, "GET", "/admin/probe-jobs/tickets")
        if job["state"] == "done":
            break
        await asyncio.sleep(0.05)
    assert (job["state"], job["total"], job["applied"]) == ("done", 2, 1)
    assert job["not_applied"] + job["still_unknown"] == 1
    assert (await _by_key(gateway, "p-2"))["state"] == "completed"


async def test_an_operation_from_before_the_history_gets_a_reconstructed_one(
    gateway_factory: GatewayFactory, upstream: CountingUpstream, tmp_path: Path
) -> None:
    """Migration 5 on a database written by the previous schema: every operation gets the
    events its row proves, marked as reconstructed, and verifies."""
    gateway = await _guarded(gateway_factory, upstream)
    assert (await gateway.post("/tickets/v1/t", key="m-1", json_body={})).status == 201
    from harness import stop_gateway

    await stop_gateway(gateway)
    with sqlite3.connect(tmp_path / "gateway.db") as db:
        db.execute("DROP TABLE operation_events")
        db.execute("DROP INDEX operations_by_request_expiry")
        db.execute("DROP INDEX operations_by_request")  # and version 6's
        db.execute("DROP TABLE similar_refusals")
        db.execute("DROP INDEX operations_by_kind")  # and version 7's
        db.execute("DROP TABLE probe_calibrations")
        for table in ("history_keyed_since", "history_checkpoints", "history_checkpoint_log"):
            db.execute(f"DROP TABLE {table}")  # and version 8's
        for table in ("request_log", "request_counts"):
            db.execute(f"DROP TABLE {table}")  # and version 10's
        db.execute("DELETE FROM gateway_meta WHERE name = 'fingerprint_v2_since'")
        for column in ("history_seq", "history_head", "request_kept", "request_kind"):
            db.execute(f"ALTER TABLE operations DROP COLUMN {column}")
        db.execute("UPDATE schema_version SET version = 4")
    again = await _guarded(gateway_factory, upstream)
    operation = await _by_key(again, "m-1")
    assert _types(operation) == ["claimed", "answered"]
    assert all(event["reconstructed"] for event in operation["history"])
    _, report, _ = await _admin(again, "GET", f"/admin/operations/{operation['id']}/verify")
    assert report["ok"]


@pytest.mark.parametrize("path", ["/admin/operations/op_x/history", "/admin/verify"])
async def test_history_endpoints_need_the_admin_token(
    gateway_factory: GatewayFactory, upstream: CountingUpstream, path: str
) -> None:
    gateway = await _guarded(gateway_factory, upstream)
    assert gateway.admin_url is not None
    async with gateway.session.get(gateway.admin_url + path) as response:
        assert response.status == 401


def _forge(db_path: Path, operation_id: str) -> None:
    """Rewrite the answered status and recompute every hash after it and the row's head,
    as someone with write access and the format (but no history key) would."""
    with sqlite3.connect(db_path) as db:
        rows = db.execute(
            "SELECT seq, type, at_us, actor, version, data, prev FROM operation_events "
            "WHERE operation_id = ? ORDER BY seq",
            (operation_id,),
        ).fetchall()
        head = ""
        for seq, type_, at_us, actor, version, data, _ in rows:
            if type_ == "answered":  # the status only: a salted commitment may hold "201" too
                data = canonical({**json.loads(data), "status": 500}).decode()
            digest = event_hash(
                prev=head, seq=seq, at_us=at_us, version=version, type=type_, actor=actor,
                data=data,
            )  # fmt: skip
            db.execute(
                "UPDATE operation_events SET data = ?, prev = ?, hash = ? "
                "WHERE operation_id = ? AND seq = ?",
                (data, head, digest, operation_id, seq),
            )
            head = digest
        db.execute("UPDATE operations SET history_head = ? WHERE id = ?", (head, operation_id))


@pytest.mark.parametrize("keyed", [False, True], ids=["no-key", "history-key"])
async def test_a_history_key_catches_a_forger_who_recomputes_the_hashes(
    gateway_factory: GatewayFactory, upstream: CountingUpstream, tmp_path: Path, keyed: bool
) -> None:
    """Without a key the chain shows naive edits only (the docs say so): a forger who
    recomputes the hashes passes. With `[store] history_key` every event is HMAC-chained,
    and a recomputed plain chain is named broken."""
    store = {"history_key": base64.b64encode(bytes(range(32))).decode()} if keyed else {}
    gateway = await _guarded(gateway_factory, upstream, store=store)
    assert (await gateway.post("/tickets/v1/t", key="k-1", json_body={})).status == 201
    operation = await _by_key(gateway, "k-1")
    _, report, _ = await _admin(gateway, "GET", f"/admin/operations/{operation['id']}/verify")
    assert report["ok"], report

    _forge(tmp_path / "gateway.db", operation["id"])
    _, report, _ = await _admin(gateway, "GET", f"/admin/operations/{operation['id']}/verify")
    if keyed:
        assert not report["ok"]
        assert report["broken"]["seq"] == 1
        assert "not keyed" in report["broken"]["reason"]
    else:
        assert report["ok"]  # the limit the docs state: no key, no defence against this


async def test_probe_verdicts_are_chained_with_the_history_key_on_postgres(
    postgres_url: str, gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """Evidence events (probe verdicts that settle nothing) are keyed like the rest, and a
    repeated verdict is counted on one event: the chain still verifies."""
    key = base64.b64encode(bytes(range(32))).decode()
    gateway = await _guarded(
        gateway_factory,
        upstream,
        store_url=postgres_url,
        store={"history_key": key},
        route={"probe": effects_probe(not_applied_after="1h", applies_to=("POST /v1/t",))},
    )
    status = (
        await gateway.post("/tickets/v1/t?drop=before_effect", key="e-1", json_body={})
    ).status
    assert status == 502
    operation = await _by_key(gateway, "e-1")
    for _ in range(2):
        status, probed, _ = await _admin(
            gateway, "POST", f"/admin/operations/{operation['id']}/probe"
        )
        assert (status, probed["state"]) == (200, "unknown")
    probes = [event for event in probed["history"] if event["type"] == "probe"]
    assert [(p["verdict"], p.get("count")) for p in probes] == [("not_applied_too_soon", 2)]
    _, report, _ = await _admin(gateway, "GET", f"/admin/operations/{operation['id']}/verify")
    assert report["ok"], report


async def test_the_forger_changes_the_status_only_whatever_the_salted_commitments_hold(
    gateway_factory: GatewayFactory,
    upstream: CountingUpstream,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`_forge` edits the answered status and nothing else: a salted commitment (random hex,
    ~1.5% of them contain "201") must come through the forge intact, or the no-key case of
    the test above fails on "an erasable field does not match its commitment"."""
    import gateway.engine.lifecycle_events as lifecycle_events
    from gateway.engine.history import COMMITMENT

    def with_201(*args: Any, **kwargs: Any) -> Any:
        for _ in range(20_000):  # real salts; P(no "201" in 20,000 draws) ~ 1e-132
            event = new_event(*args, **kwargs)
            commitments = [v for k, v in event.data.items() if k.endswith(COMMITMENT)]
            if not commitments or any("201" in v for v in commitments):
                return event
        raise AssertionError("no commitment with 201 drawn")

    monkeypatch.setattr(lifecycle_events, "new_event", with_201)
    gateway = await _guarded(gateway_factory, upstream)
    assert (await gateway.post("/tickets/v1/t", key="c-1", json_body={})).status == 201
    operation = await _by_key(gateway, "c-1")
    with sqlite3.connect(tmp_path / "gateway.db") as db:
        (claimed,) = db.execute(
            "SELECT data FROM operation_events WHERE operation_id = ? AND seq = 1",
            (operation["id"],),
        ).fetchone()
    assert "201" in json.loads(claimed)["request_commitment"]  # what the forge must not touch
    _forge(tmp_path / "gateway.db", operation["id"])
    _, report, _ = await _admin(gateway, "GET", f"/admin/operations/{operation['id']}/verify")
    assert report["ok"], report["broken"]
    after = await _by_key(gateway, "c-1")
    assert [e.get("status") for e in after["history"] if e["type"] == "answered"] == [500]
