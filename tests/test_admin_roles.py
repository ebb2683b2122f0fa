"""Named admin tokens with roles (issue "The operator's second hour").

One shared token and a typed name: the actor was whatever the person typed, or
"admin", and everyone who could read could also force and redact. Named tokens
(`[[admin.tokens]]`: name, SHA-256, role) name their holder in the history and bound
what each may do; the shared `[admin] token` stays, as role `admin`.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

import pytest
from conftest import GatewayFactory
from harness import ADMIN_TOKEN, RunningGateway
from pydantic import ValidationError
from test_cli import make_unknown, operation_id
from upstream import CountingUpstream

from gateway.config import Settings

TOKENS = {role: secrets.token_urlsafe(32) for role in ("viewer", "operator", "admin")}
NAMES = {"viewer": "vera", "operator": "otto", "admin": "ada"}


def sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def named_tokens(**extra: str) -> list[dict[str, str]]:
    made = [
        {"name": NAMES[role], "token_sha256": sha(token), "role": role}
        for role, token in TOKENS.items()
    ]
    return made + [
        {"name": name, "token_sha256": sha(token), "role": "admin"} for name, token in extra.items()
    ]


async def call(
    gateway: RunningGateway,
    method: str,
    path: str,
    role: str | None,
    body: Any = None,
    *,
    token: str | None = None,
    label: str = "",
) -> tuple[int, Any]:
    assert gateway.admin_url is not None
    headers = {"Authorization": f"Bearer {token or TOKENS[role or 'admin']}"}
    if label:
        headers["X-Admin-Actor"] = label
    async with gateway.session.request(
        method, gateway.admin_url + path, json=body, headers=headers
    ) as answer:
        return answer.status, await answer.json(content_type=None)


def kind(problem: Any) -> str:
    return str(problem["type"]).rsplit("/", 1)[-1]


async def test_each_role_does_what_it_may_and_is_named_in_the_history(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    gateway = await gateway_factory(upstream.url, admin={"tokens": named_tokens()})
    for key in ("k-1", "k-2", "k-3"):
        await make_unknown(gateway, key)
    ops = {key: await operation_id(gateway, key) for key in ("k-1", "k-2", "k-3")}
    applied = {"outcome": "applied", "note": "it exists", "response": {"status": 201, "body": "x"}}
    release = {"outcome": "not_applied", "note": "not there", "force": True}

    # A viewer reads everything and changes nothing.
    for path in ("/admin/overview", "/admin/operations", f"/admin/operations/{ops['k-1']}"):
        status, _ = await call(gateway, "GET", path, "viewer")
        assert status == 200, path
    status, problem = await call(
        gateway, "POST", f"/admin/operations/{ops['k-1']}/resolve", "viewer", applied
    )
    assert (status, kind(problem), problem["next_action"]) == (403, "role-forbidden", "stop")
    assert "'vera' has the role 'viewer'" in problem["detail"]

    # An operator resolves, but neither forces nor redacts nor trusts a probe.
    for path, body in (
        (f"/admin/operations/{ops['k-2']}/resolve", release),
        (f"/admin/operations/{ops['k-2']}/redact", {"reason": "gdpr"}),
        ("/admin/probes/tickets/trust", {"kind": "POST /*", "note": "n"}),
    ):
        status, problem = await call(gateway, "POST", path, "operator", body)
        assert (status, kind(problem)) == (403, "role-forbidden"), path
    status, document = await call(
        gateway, "POST", f"/admin/operations/{ops['k-1']}/resolve", "operator", applied,
        label="night shift",
    )  # fmt: skip
    assert status == 200, document
    (resolved,) = [event for event in document["history"] if event["type"] == "resolved"]
    assert resolved["actor"] == "admin:otto (night shift)", "the token names who; the label adds"

    # An admin forces and redacts.
    status, document = await call(
        gateway, "POST", f"/admin/operations/{ops['k-2']}/resolve", "admin", release
    )
    assert (status, document["state"]) == (200, "released")
    (resolved,) = [event for event in document["history"] if event["type"] == "resolved"]
    assert (resolved["actor"], resolved["force"]) == ("admin:ada", True)
    status, _ = await call(
        gateway, "POST", f"/admin/operations/{ops['k-3']}/redact", "admin", {"reason": "gdpr"}
    )
    assert status == 200

    status, overview = await call(gateway, "GET", "/admin/overview", "operator", label="x")
    assert overview["you"] == {"name": "otto", "role": "operator", "actor": "admin:otto (x)"}
    assert upstream.count == 3


async def test_the_shared_token_stays_an_admin_beside_named_ones(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    gateway = await gateway_factory(
        upstream.url, admin={"token": ADMIN_TOKEN, "tokens": named_tokens()}
    )
    await make_unknown(gateway, "k-s")
    op_id = await operation_id(gateway, "k-s")
    status, document = await call(
        gateway, "POST", f"/admin/operations/{op_id}/resolve", None,
        {"outcome": "not_applied", "note": "n", "force": True}, token=ADMIN_TOKEN, label="sam",
    )  # fmt: skip
    assert status == 200, document
    assert document["history"][-2]["actor"] == "admin:sam"
    status, problem = await call(gateway, "GET", "/admin/overview", None, token="nope" * 8)
    assert (status, kind(problem)) == (401, "unauthorized")


async def test_a_guessable_named_token_is_refused_when_used(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """The config holds digests only, so a weak token shows when it is presented."""
    weak = "adminadminadminadminadmin"
    gateway = await gateway_factory(upstream.url, admin={"tokens": named_tokens(weak=weak)})
    status, problem = await call(gateway, "GET", "/admin/overview", None, token=weak)
    assert (status, kind(problem)) == (401, "unauthorized")
    assert "guessable" in problem["detail"]


@pytest.mark.parametrize(
    ("admin", "clients", "says"),
    [
        (
            {"tokens": [{"name": "a", "token_sha256": sha("t" * 30), "role": "root"}]},
            [],
            "viewer",
        ),
        (
            {
                "tokens": [
                    {"name": "a", "token_sha256": sha("t" * 30), "role": "viewer"},
                    {"name": "a", "token_sha256": sha("u" * 30), "role": "admin"},
                ]
            },
            [],
            "a name of its own",
        ),
        (
            {"tokens": [{"name": "a", "token_sha256": sha("t" * 30), "role": "viewer"}]},
            [{"name": "agent", "token_sha256": [sha("t" * 30)]}],
            "also belongs to clients[0]",
        ),
        (
            {
                "tokens": [
                    {"name": "a", "token_sha256": sha("t" * 30), "role": "viewer"},
                    {"name": "b", "token_sha256": sha("t" * 30), "role": "admin"},
                ]
            },
            [],
            "also belongs to admin.tokens[0]",
        ),
        (
            {"token": ADMIN_TOKEN},
            [{"name": "agent", "token_sha256": [sha(ADMIN_TOKEN)]}],
            "also the token of clients[0]",
        ),
    ],
)
def test_token_digests_name_one_holder(
    admin: dict[str, Any], clients: list[dict[str, Any]], says: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        Settings.model_validate({"admin": admin, "clients": clients})
    assert says in str(refused.value)


def test_named_tokens_alone_turn_the_admin_api_on() -> None:
    settings = Settings.model_validate({"admin": {"tokens": named_tokens()}})
    assert settings.admin.enabled
