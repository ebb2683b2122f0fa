"""Secrets stay secret in the recorded request, whatever the body's format (issue:
"Secrets stay secret", finding 2).

The review found verbatim in the store: form-encoded `password=hunter2&api_key=...`,
multipart fields, JSON sent as `text/plain`, JSON with a trailing comma, a body with one
invalid UTF-8 byte (stored as base64 of the whole body), `accessToken`,
`refreshToken`, `clientSecret`, and the query name `api_key[]`. `redact_request` now
reads every format it can and keeps only size and digest of what it cannot.
"""

from __future__ import annotations

import json
import re
import secrets
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from conftest import GatewayFactory
from harness import ADMIN_TOKEN, RunningGateway
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from suite_profile import examples
from test_cli import admin, cli, operation_id
from test_cli_history import admin_json
from upstream import CountingUpstream

from gateway.config.routes import DEFAULT_REQUEST_REDACTIONS
from gateway.engine.recorded_request import DEFAULT_NAMES, Redactions, http_record

SECRET = "hunter2-Zq9"


def record(content_type: str | None, body: bytes, target: str = "/v1/t") -> dict[str, Any]:
    made = http_record(
        method="POST",
        target=target,
        content_type=content_type,
        body=body,
        limit=64 << 10,
        redact=DEFAULT_REQUEST_REDACTIONS,
        digest=lambda kept: f"hmac-sha256:{len(kept)}",
    )
    assert made is not None
    return made


def test_the_default_names_are_the_configs_defaults_normalised() -> None:
    assert {Redactions.normal(name) for name in DEFAULT_REQUEST_REDACTIONS} == DEFAULT_NAMES


def test_each_format_of_the_review_keeps_no_secret() -> None:
    """Every body of the review, recorded with the default names: the secret is gone,
    and what could be read is still there for an operator."""
    cases = {
        "form": ("application/x-www-form-urlencoded", f"password={SECRET}&api_key={SECRET}&n=1"),
        "multipart": (
            "multipart/form-data; boundary=XyZ",
            '--XyZ\r\nContent-Disposition: form-data; name="title"\r\n\r\nprinter\r\n'
            f'--XyZ\r\nContent-Disposition: form-data; name="password"\r\n\r\n{SECRET}\r\n'
            "--XyZ--\r\n",
        ),
        "json as text/plain": ("text/plain", json.dumps({"password": SECRET, "n": 1})),
        "camelCase names": (
            "application/json",
            json.dumps({"accessToken": SECRET, "refreshToken": SECRET, "clientSecret": SECRET}),
        ),
        "a trailing comma": ("application/json", f'{{"password": "{SECRET}",}}'),
    }
    for name, (content_type, text) in cases.items():
        made = record(content_type, text.encode())
        assert SECRET not in json.dumps(made), name
    assert "printer" in record(cases["multipart"][0], cases["multipart"][1].encode())["body"]
    invalid = json.dumps({"password": SECRET}).encode() + b"\xff"
    made = record("application/json", invalid)
    assert (made["body"], made["body_gone"]) == (None, "unparsed")
    assert SECRET not in json.dumps(made)
    query = record(None, b"", target=f"/v1/t?api_key[]={SECRET}&x=1")
    assert SECRET not in query["target"]
    assert "x=1" in query["target"]


_SECRET_NAMES = ["password", "api_key", "accessToken", "refresh-token", "client_secret",
                 "Authorization", "x_api_key", "apiKey[]", "SECRET", "myToken"]  # fmt: skip


def _spelled(name: str) -> st.SearchStrategy[str]:
    return st.sampled_from([name, name.upper(), name.lower(), name.replace("_", "-")])


_values = st.binary(min_size=6, max_size=10).map(lambda raw: "zq" + raw.hex())
"""Secret values no other text holds by chance ("zq" and 12 to 20 hex digits)."""
_plain_names = st.sampled_from(["title", "amount", "n", "note", "customer", "items"])


@st.composite
def _json_documents(draw: st.DrawFn, secret: str) -> Any:
    """A JSON document with one secret-named member holding `secret` at a random depth."""
    depth = draw(st.integers(min_value=0, max_value=4))
    inner: Any = {draw(st.sampled_from(_SECRET_NAMES).flatmap(_spelled)): secret}
    for _ in range(depth):
        key = draw(_plain_names)
        inner = draw(st.sampled_from([{key: inner, "n": 1}, [inner, 2], {key: [1, inner]}]))
    return inner


@settings(max_examples=examples(200), deadline=None)
@given(data=st.data(), secret=_values)
def test_no_secret_value_survives_in_any_format(data: st.DataObject, secret: str) -> None:
    """Random JSON (under JSON and other media types), form and multipart bodies with
    secret-named fields at random depths and spellings: the recorded request (what the
    store keeps, the admin JSON and the console show, the CLI prints) never holds the
    secret's value."""
    form = data.draw(st.sampled_from(["json", "json-as-text", "form", "multipart"]))
    name = data.draw(st.sampled_from(_SECRET_NAMES).flatmap(_spelled))
    if form in ("json", "json-as-text"):
        body = json.dumps(data.draw(_json_documents(secret))).encode()
        content_type = "application/json" if form == "json" else "text/plain"
    elif form == "form":
        fields = [("title", "printer"), (name, secret), ("n", "1")]
        body, content_type = urlencode(fields).encode(), "application/x-www-form-urlencoded"
    else:
        body = (
            f'--b0\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{secret}\r\n'
            '--b0\r\nContent-Disposition: form-data; name="title"\r\n\r\nprinter\r\n--b0--\r\n'
        ).encode()
        content_type = "multipart/form-data; boundary=b0"
    made = record(content_type, body, target=f"/v1/t?{name}={secret}")
    assert re.search(re.escape(secret), json.dumps(made)) is None, made


@settings(
    max_examples=examples(15, fast=5),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data(), secret=_values)
async def test_a_secret_reaches_no_surface_through_a_gateway(
    gateway_factory: GatewayFactory,
    upstream: CountingUpstream,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    data: st.DataObject,
    secret: str,
) -> None:
    """Through a gateway as installed (no encryption at rest): a form, multipart or
    JSON-as-text body with a secret-named field leaves the secret's value in neither the
    store's file, the admin JSON (what the console shows), the CLI's output nor the log."""
    gateway = await _shared_gateway(gateway_factory, upstream)
    name = data.draw(st.sampled_from(_SECRET_NAMES).flatmap(_spelled))
    form = data.draw(st.sampled_from(["form", "multipart", "json-as-text", "broken-json"]))
    if form == "form":
        body, content_type = urlencode([("title", "x"), (name, secret)]).encode(), FORM
    elif form == "multipart":
        body = (
            f'--b1\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{secret}\r\n--b1--\r\n'
        ).encode()
        content_type = "multipart/form-data; boundary=b1"
    elif form == "json-as-text":
        body, content_type = json.dumps({"a": {name: secret}}).encode(), "text/plain"
    else:
        body, content_type = f'{{"{name}": "{secret}",}}'.encode(), "application/json"
    key = "s-" + secrets.token_hex(8)
    answer = await gateway.post(
        f"/tickets/v1/t?size=16&{name}={secret}",  # the tool answers 16 bytes of its own
        key=key,
        data=body,
        headers={"Content-Type": content_type},
    )
    assert answer.status == 201
    document = await admin_json(gateway, f"/admin/operations/{await operation_id(gateway, key)}")
    capsys.readouterr()
    assert await cli(admin(gateway, "show", document["id"])) == 0
    printed = capsys.readouterr().out
    stored = _store_files(tmp_path)
    for surface in (json.dumps(document), printed, caplog.text, stored.decode("latin-1")):
        assert secret not in surface, form


FORM = "application/x-www-form-urlencoded"
_GATEWAYS: dict[int, RunningGateway] = {}


async def _shared_gateway(factory: GatewayFactory, upstream: CountingUpstream) -> RunningGateway:
    """One gateway (with an admin token) for every example of a test: the factory stops it
    after the test."""
    if id(factory) not in _GATEWAYS:
        _GATEWAYS.clear()
        _GATEWAYS[id(factory)] = await factory(upstream.url, admin={"token": ADMIN_TOKEN})
    return _GATEWAYS[id(factory)]


def _store_files(directory: Path) -> bytes:
    """Every byte of the SQLite store: the file, its WAL and shared memory."""
    return b"".join(path.read_bytes() for path in sorted(directory.glob("gateway.db*")))
