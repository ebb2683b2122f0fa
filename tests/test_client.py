"""The Python client against a real gateway on loopback: every exception from a real answer."""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import re
import signal
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import idempotency_gateway_client as client_package
import pytest
import pytest_asyncio
from conftest import GatewayFactory
from harness import RELEASE_SOON, GatewayProcess, RunningGateway, spawn
from idempotency_gateway_client import (
    Backoff,
    FileJournal,
    GatewayClient,
    GatewayClientError,
    GatewayConnectionError,
    GatewayProblem,
    HttpTool,
    InProgress,
    InvalidKey,
    InvalidRequest,
    KeyConflict,
    KeyFormatError,
    KeyMismatch,
    KeyMismatchUnsettled,
    LeaseLost,
    MethodNotAllowed,
    MissingKey,
    NoRoute,
    NotResolvable,
    OutcomeUnknown,
    PayloadTooLarge,
    PreconditionFailed,
    QuotaExceeded,
    ReceiptExpired,
    ReceiptNotRetained,
    ReconciliationRequired,
    RouteSaturated,
    Run,
    RunEvent,
    StoredResponse,
    StoreUnavailable,
    TooEarly,
    ToolCall,
    Turn,
    Unauthorized,
    Unavailable,
    UnknownKey,
    UpstreamConnectionLost,
    UpstreamTimeout,
    UpstreamUnreachable,
    derive_key,
    operation_path,
)
from idempotency_gateway_client import _exceptions as exceptions_module
from idempotency_gateway_client._problems import problem_from
from upstream import CountingUpstream

ISSUES = "/tickets/v1/issues"
NEVER = Backoff.none()
ClientFactory = Callable[..., GatewayClient]


@pytest_asyncio.fixture
async def make_client() -> AsyncIterator[ClientFactory]:
    """Build clients (no retries unless asked); all are closed after the test."""
    made: list[GatewayClient] = []

    def make(url: str, **options: Any) -> GatewayClient:
        options.setdefault("backoff", NEVER)
        client = GatewayClient(url, **options)
        made.append(client)
        return client

    yield make
    for client in made:
        await client.close()


@pytest.fixture
def gw(gateway: RunningGateway, make_client: ClientFactory) -> GatewayClient:
    """A client of the default gateway (route /tickets in front of the counting upstream)."""
    return make_client(gateway.url)


def is_stopped(pid: int) -> bool:
    """Whether the process is stopped by a signal (state T in /proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] in ("T", "t")


# -- the package surface ---------------------------------------------------------------


def test_all_names_exactly_the_public_objects() -> None:
    """`__all__` lists every public name of the package, and each one exists."""
    public = {
        name
        for name, value in vars(client_package).items()
        if not name.startswith("_") and not inspect.ismodule(value) and name != "annotations"
    }
    assert set(client_package.__all__) == public
    assert len(client_package.__all__) == len(set(client_package.__all__))


def test_exception_tree_docstring_names_every_exception() -> None:
    """The ASCII tree at the top of `_exceptions.py` shows every exception class."""
    classes = [
        value
        for value in vars(exceptions_module).values()
        if isinstance(value, type) and issubclass(value, GatewayClientError)
    ]
    assert len(classes) > 30
    doc = exceptions_module.__doc__ or ""
    for cls in classes:
        assert re.search(rf"^[\s│]*(?:[├└]── )?{cls.__name__}(\s|$)", doc, re.M), cls.__name__


def test_derive_key_is_stable_and_refuses_ambiguous_parts() -> None:
    """Keys are `run_id:turn:call_id`; parts that would collide or be refused fail early."""
    assert derive_key("run-77", 0, "c1") == "run-77:0:c1"
    assert derive_key("run-77", 3, "call:x") == "run-77:3:call:x"
    for args in (("run:77", 0, "c1"), ("", 0, "c1"), ("r", -1, "c1"), ("r", 0, ""),
                 ("r", 0, "é"), ("r" * 250, 0, "c1234")):  # fmt: skip
        with pytest.raises(KeyFormatError):
            derive_key(*args)  # type: ignore[arg-type]
    assert issubclass(KeyFormatError, ValueError)


def test_backoff_is_bounded_and_validated() -> None:
    """Backoff honours Retry-After, doubles otherwise, and stops at attempts or total time."""
    backoff = Backoff(attempts=3, total=1.0, initial=0.1, maximum=0.3)
    assert backoff.next_delay(1, 0.0, None) == pytest.approx(0.1)
    assert backoff.next_delay(2, 0.1, None) == pytest.approx(0.2)
    assert backoff.next_delay(3, 0.3, None) is None
    assert backoff.next_delay(1, 0.0, 2.0) is None  # Retry-After beyond the budget
    with pytest.raises(ValueError, match="attempts"):
        Backoff(attempts=0)


def test_only_the_gateways_problems_become_exceptions() -> None:
    """An upstream's own problem+json, or a replayed receipt, is a response, not a problem."""
    headers = {"Content-Type": "application/problem+json"}
    upstream_problem = json.dumps({"type": "https://tool.example/problems/x", "status": 400})
    assert problem_from(400, headers, upstream_problem.encode()) is None
    ours = json.dumps({"type": "https://idempotency-gateway.dev/problems/key-mismatch"}).encode()
    assert isinstance(problem_from(422, headers, ours), KeyMismatch)
    assert problem_from(422, {**headers, "Idempotent-Replayed": "true"}, ours) is None
    newer = json.dumps({"type": "https://idempotency-gateway.dev/problems/from-the-future"})
    problem = problem_from(418, headers, newer.encode())
    assert type(problem) is GatewayProblem
    assert problem.kind == "from-the-future"


# -- requests, replays and lookups ---------------------------------------------------------


async def test_request_sends_the_key_and_a_retry_is_replayed(
    gw: GatewayClient, upstream: CountingUpstream
) -> None:
    """The first answer is live; the same call again is the stored receipt (`replayed`)."""
    first = await gw.request("POST", ISSUES, key="run-1:0:c1", json={"title": "a", "n": 1})
    assert (first.status, first.replayed, first.state) == (201, False, "completed")
    operation = await gw.lookup("run-1:0:c1")
    assert operation is not None
    assert upstream.effects[0].key == operation.id  # the forwarded key: the operation id
    # Same arguments in another order: canonical JSON, same bytes, same fingerprint.
    again = await gw.request("POST", ISSUES, key="run-1:0:c1", json={"n": 1, "title": "a"})
    assert (again.status, again.replayed) == (201, True)
    assert again.body == first.body
    assert again.json()["effect"] == 1
    assert upstream.count == 1


async def test_the_tools_own_errors_are_responses(
    gw: GatewayClient, upstream: CountingUpstream
) -> None:
    """A 500 from the tool is the tool's answer, returned (and replayed), not an exception."""
    response = await gw.request("POST", ISSUES + "?status=500", key="t500", json={})
    assert response.status == 500
    assert (await gw.request("POST", ISSUES + "?status=500", key="t500", json={})).replayed
    assert upstream.count == 1


@pytest.mark.parametrize("method", ["GET", "HEAD", "get"])
@pytest.mark.parametrize(
    "body", [{"json": {"q": "x"}}, {"json": {}}, {"content": b"q=x"}], ids=["json", "{}", "content"]
)
async def test_a_body_on_get_or_head_is_refused_before_anything_is_sent(
    gw: GatewayClient, upstream: CountingUpstream, method: str, body: dict[str, Any]
) -> None:
    """The TypeScript client cannot send one (fetch refuses it), so neither client does."""
    with pytest.raises(ValueError, match=r"GET|HEAD.*no body"):
        await gw.request(method, ISSUES, key="get-body", **body)
    assert upstream.count == 0


@pytest.mark.parametrize("method", ["GET", "HEAD", "DELETE", "POST"])
async def test_json_none_sends_no_body_and_no_content_type(
    gw: GatewayClient, upstream: CountingUpstream, method: str
) -> None:
    """A planned call without a body (`json: null`) sends none, as the TypeScript client does.

    Not the JSON text `null`, and no `Content-Type` (aiohttp would add
    `application/octet-stream` to a bodiless POST; the gateway fingerprints it).
    """
    await gw.request(method, ISSUES, key=f"no-body-{method}", json=None)
    [effect] = upstream.effects
    assert (effect.method, effect.body, effect.headers.get("content-type")) == (method, b"", None)


async def test_default_headers_go_with_every_request_and_scope_lookups(
    gateway: RunningGateway, make_client: ClientFactory, upstream: CountingUpstream
) -> None:
    """Default headers (the scope's credential) are sent; another scope cannot see the key."""
    alice = make_client(gateway.url, headers={"Authorization": "Bearer alice", "X-Agent": "a1"})
    bob = make_client(gateway.url, headers={"Authorization": "Bearer bob"})
    await alice.request("POST", ISSUES, key="scoped", json={})
    assert upstream.effects[0].headers["x-agent"] == "a1"
    assert (await alice.lookup("scoped")) is not None
    assert await bob.lookup("scoped") is None


async def test_lookup_returns_a_typed_operation_with_its_etag(
    gw: GatewayClient, upstream: CountingUpstream
) -> None:
    """A lookup parses the operation JSON; odd keys are percent-encoded; 404 is None."""
    key = "run 7/x:0:c1?"
    await gw.request("POST", ISSUES, key=key, json={"title": "x"})
    operation = await gw.lookup(key)
    assert operation is not None
    assert (operation.key, operation.state, operation.method) == (key, "completed", "POST")
    assert operation.path == ISSUES
    assert operation.attempts == 1
    assert operation.safe_to_retry is True
    assert operation.has_receipt
    assert operation.response is not None
    assert operation.response.status == 201
    assert operation.response.body_json()["key"] == operation.id  # what the upstream saw
    assert operation.etag
    assert operation.id in operation.etag
    assert operation.created_at.tzinfo is not None
    assert operation.model_extra
    assert "fencing_token" in operation.model_extra
    assert operation_path(key) == "/operations/run%207%2Fx%3A0%3Ac1%3F"
    assert await gw.lookup("never-used") is None


async def test_keys_that_look_quoted_are_sent_as_structured_strings(
    gw: GatewayClient, upstream: CountingUpstream
) -> None:
    """A key starting with `"` reaches the gateway as itself, not unquoted into another key."""
    key = '"quo\\ted"'  # a quote first, a backslash inside
    await gw.request("POST", ISSUES, key=key, json={})
    operation = await gw.lookup(key)
    assert operation is not None
    assert upstream.effects[0].key == operation.id
    assert await gw.lookup("quo\\ted") is None


async def test_the_echoed_key_reads_back_as_the_key_sent(
    gw: GatewayClient, upstream: CountingUpstream
) -> None:
    """`Response.key` (the gateway's `Idempotency-Key` answer header) is the key that was sent."""
    key = '"quo\\ted"'
    response = await gw.request("POST", ISSUES, key=key, json={})
    assert response.key == key


# -- every problem type, from a real answer -------------------------------------------------


async def test_key_mismatch_keeps_every_field_of_the_problem(
    gw: GatewayClient, upstream: CountingUpstream
) -> None:
    """422 key-mismatch is KeyMismatch with status, type, title, detail, key, state, lookup URL."""
    await gw.request("POST", ISSUES, key="k:1", json={"a": 1})
    with pytest.raises(KeyMismatch) as caught:
        await gw.request("POST", ISSUES, key="k:1", json={"a": 2})
    problem = caught.value
    assert isinstance(problem, KeyConflict)
    assert (problem.status, problem.problem_type, problem.kind) == (422, *["key-mismatch"] * 2)
    assert problem.title
    assert problem.detail
    assert (problem.key, problem.state, problem.safe_to_retry) == ("k:1", "completed", False)
    assert problem.operation == "/operations/k%3A1"
    assert problem.problem["status"] == 422
    assert "key-mismatch" in repr(problem)
    assert upstream.count == 1


async def test_in_progress_is_waited_out_or_raised(
    gw: GatewayClient,
    make_client: ClientFactory,
    gateway: RunningGateway,
    upstream: CountingUpstream,
) -> None:
    """409 in-progress: retried after Retry-After until the receipt; raised without retries."""
    slow = asyncio.create_task(gw.request("POST", ISSUES + "?delay=1.2", key="slow", json={}))
    await upstream.wait_for_count(1)
    with pytest.raises(InProgress) as caught:
        await gw.request("POST", ISSUES + "?delay=1.2", key="slow", json={})
    assert caught.value.status == 409
    assert caught.value.safe_to_retry is True
    assert caught.value.retry_after is not None
    assert caught.value.retry_after >= 1
    patient = make_client(gateway.url, backoff=Backoff(attempts=5, total=5.0))
    started = time.monotonic()
    waited = await patient.request("POST", ISSUES + "?delay=1.2", key="slow", json={})
    assert waited.replayed
    assert waited.status == 201
    assert time.monotonic() - started >= 0.5
    assert (await slow).status == 201
    assert upstream.count == 1


async def test_prefer_wait_gets_the_outcome_in_one_request(
    gw: GatewayClient, upstream: CountingUpstream
) -> None:
    """With `wait=N` the gateway holds the retry until the first attempt's receipt exists."""
    slow = asyncio.create_task(gw.request("POST", ISSUES + "?delay=0.6", key="pw", json={}))
    await upstream.wait_for_count(1)
    waited = await gw.request("POST", ISSUES + "?delay=0.6", key="pw", json={}, wait=5)
    assert (waited.status, waited.replayed) == (201, True)
    await slow
    assert upstream.count == 1


async def test_connection_lost_and_then_outcome_unknown(
    gw: GatewayClient, upstream: CountingUpstream
) -> None:
    """upstream-connection-lost raises OutcomeUnknown; so does every retry, never forwarded."""
    with pytest.raises(UpstreamConnectionLost) as caught:
        await gw.request("POST", ISSUES + "?drop=after_effect", key="lost", json={})
    assert isinstance(caught.value, OutcomeUnknown)
    assert (caught.value.status, caught.value.state) == (502, "unknown")
    assert caught.value.safe_to_retry is False
    with pytest.raises(OutcomeUnknown) as again:
        await gw.request("POST", ISSUES + "?drop=after_effect", key="lost", json={})
    assert type(again.value) is OutcomeUnknown
    assert again.value.problem_type == "outcome-unknown"
    assert upstream.count == 1


async def test_upstream_timeout_is_an_unknown_outcome(
    gateway_factory: GatewayFactory, upstream: CountingUpstream, make_client: ClientFactory
) -> None:
    """504 upstream-timeout raises UpstreamTimeout, an OutcomeUnknown."""
    gateway = await gateway_factory(upstream.url, route={"timeout": "300ms"})
    with pytest.raises(OutcomeUnknown) as caught:
        await make_client(gateway.url).request("POST", ISSUES + "?delay=1", key="to", json={})
    assert type(caught.value) is UpstreamTimeout
    assert caught.value.status == 504


async def test_upstream_unreachable_is_retried_within_the_backoff(
    gateway_factory: GatewayFactory, make_client: ClientFactory, refused_port: int
) -> None:
    """502 upstream-unreachable (released, safe) is resent with the same key, then raised."""
    gateway = await gateway_factory(f"http://127.0.0.1:{refused_port}")
    client = make_client(gateway.url, backoff=Backoff(attempts=3, initial=0.01, maximum=0.02))
    with pytest.raises(UpstreamUnreachable) as caught:
        await client.request("POST", ISSUES, key="down", json={})
    assert (caught.value.status, caught.value.safe_to_retry) == (502, True)
    operation = await client.lookup("down")
    assert operation is not None
    assert (operation.state, operation.attempts) == ("released", 3)


async def test_store_unavailable_is_raised_or_retried_until_the_store_is_back(
    gateway_factory: GatewayFactory,
    upstream: CountingUpstream,
    make_client: ClientFactory,
    tmp_path: Path,
) -> None:
    """503 store-unavailable: raised without retries; with them, the call succeeds once."""
    gateway = await gateway_factory(upstream.url, store={"busy_timeout": "150ms"})
    blocker = sqlite3.connect(tmp_path / "gateway.db", isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # a real writer holding the database lock
    try:
        with pytest.raises(StoreUnavailable) as caught:
            await make_client(gateway.url).request("POST", ISSUES, key="st", json={})
        assert isinstance(caught.value, Unavailable)
        assert (caught.value.status, caught.value.safe_to_retry) == (503, True)
        patient = make_client(gateway.url, backoff=Backoff(attempts=10, initial=0.1))
        retried = asyncio.create_task(patient.request("POST", ISSUES, key="st", json={}))
        await asyncio.sleep(0.4)
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert (await retried).status == 201
    assert upstream.count == 1


async def test_route_saturated_carries_retry_after(
    gateway_factory: GatewayFactory, upstream: CountingUpstream, make_client: ClientFactory
) -> None:
    """503 route-saturated raises RouteSaturated with the gateway's Retry-After."""
    gateway = await gateway_factory(upstream.url, route={"max_concurrency": 1})
    client = make_client(gateway.url)
    slow = asyncio.create_task(client.request("POST", ISSUES + "?delay=0.5", key="a", json={}))
    await upstream.wait_for_count(1)
    with pytest.raises(RouteSaturated) as caught:
        await client.request("POST", ISSUES, key="b", json={})
    assert caught.value.retry_after is not None
    assert caught.value.retry_after >= 1
    assert caught.value.safe_to_retry is True
    await slow


async def test_receipt_expired_and_receipt_not_retained(
    gateway_factory: GatewayFactory, upstream: CountingUpstream, make_client: ClientFactory
) -> None:
    """Completed keys without a stored body are refused, never forwarded again."""
    gateway = await gateway_factory(
        upstream.url, idempotency={"retention": "300ms"}, route={"max_stored_response": "1KiB"}
    )
    client = make_client(gateway.url)
    await client.request("POST", ISSUES, key="exp", json={})
    await client.request("POST", ISSUES + "?size=5000", key="big", json={})
    with pytest.raises(ReceiptNotRetained) as not_kept:
        await client.request("POST", ISSUES + "?size=5000", key="big", json={})
    assert not_kept.value.safe_to_retry is False
    await asyncio.sleep(0.4)
    with pytest.raises(ReceiptExpired) as expired:
        await client.request("POST", ISSUES, key="exp", json={})
    assert (expired.value.status, expired.value.state) == (409, "completed")
    operation = await client.lookup("exp")
    assert operation is not None
    assert not operation.has_receipt
    assert upstream.count == 2


async def test_bad_requests_are_refused_with_their_own_types(
    gateway_factory: GatewayFactory, upstream: CountingUpstream, make_client: ClientFactory
) -> None:
    """missing-key, invalid-key, payload-too-large and no-route each raise their class."""
    gateway = await gateway_factory(upstream.url, route={"max_body": "1KiB"})
    client = make_client(gateway.url)
    with pytest.raises(MissingKey) as missing:
        await client.request("POST", ISSUES, key=None, json={})
    assert missing.value.status == 400
    with pytest.raises(InvalidKey):  # sent raw, so the gateway (not the client) judges it
        await client.request("POST", ISSUES, key=None, headers={"Idempotency-Key": "x" * 256})
    with pytest.raises(KeyFormatError):  # the same key through `key=` never leaves the client
        await client.request("POST", ISSUES, key="x" * 256, json={})
    with pytest.raises(PayloadTooLarge) as large:
        await client.request("POST", ISSUES, key="big-body", content=b"x" * 4096)
    assert large.value.status == 413
    with pytest.raises(NoRoute) as no_route:
        await client.request("POST", "/nowhere", key="nr", json={})
    assert no_route.value.status == 404
    assert upstream.count == 0


async def test_unauthorized_without_a_client_token(
    gateway_factory: GatewayFactory, upstream: CountingUpstream, make_client: ClientFactory
) -> None:
    """With [[clients]], a missing token is Unauthorized; the configured one goes through."""
    digest = hashlib.sha256(b"tok-a").hexdigest()
    gateway = await gateway_factory(
        upstream.url, clients=[{"name": "agent-a", "token_sha256": [digest]}]
    )
    with pytest.raises(Unauthorized) as caught:
        await make_client(gateway.url).request("POST", ISSUES, key="u", json={})
    assert caught.value.status == 401
    authorized = make_client(gateway.url, headers={"Authorization": "Bearer tok-a"})
    assert (await authorized.request("POST", ISSUES, key="u", json={})).status == 201
    assert "authorization" not in upstream.effects[0].headers


async def test_quota_exceeded_carries_retry_after(
    gateway_factory: GatewayFactory, upstream: CountingUpstream, make_client: ClientFactory
) -> None:
    """429 quota-exceeded (nothing recorded) raises QuotaExceeded with the gateway's Retry-After."""
    gateway = await gateway_factory(upstream.url, quotas={"new_keys_per_minute": 1})
    client = make_client(gateway.url)
    await client.request("POST", ISSUES, key="q1", json={})
    with pytest.raises(QuotaExceeded) as caught:
        await client.request("POST", ISSUES, key="q2", json={})
    assert (caught.value.status, caught.value.safe_to_retry) == (429, True)
    assert caught.value.retry_after is not None
    assert caught.value.retry_after >= 1
    assert await client.lookup("q2") is None
    assert upstream.count == 1


async def test_wrong_method_on_an_operation_is_method_not_allowed(gw: GatewayClient) -> None:
    """DELETE on /operations/<key> raises MethodNotAllowed (405)."""
    with pytest.raises(MethodNotAllowed):
        await gw.request("DELETE", "/operations/some-key", key=None)


# -- a run's call whose key holds another request, unsettled ------------------------------


async def test_a_run_whose_call_is_refused_key_mismatch_unsettled_stops_to_reconcile(
    gw: GatewayClient, upstream: CountingUpstream, tmp_path: Path
) -> None:
    """A call refused `key-mismatch-unsettled` stops the run with ReconciliationRequired, as
    an unknown outcome does, and nothing more is sent: not the call, not the turn's next one."""
    path = ISSUES + "?hold=1"
    key, after = derive_key("run-km", 0, "c1"), derive_key("run-km", 0, "c2")

    def plan(turns: tuple[Turn, ...]) -> list[ToolCall]:
        """The key's call again with other arguments (the plan made anew), then another call."""
        if turns:
            return []
        return [
            ToolCall(call_id="c1", name="ticket", arguments={"title": "printer on fire"}),
            ToolCall(call_id="c2", name="ticket", arguments={"title": "and the fax"}),
        ]

    events: list[RunEvent] = []
    journal = FileJournal(tmp_path / "run.json")
    tools = {"ticket": HttpTool("POST", path)}
    async with asyncio.timeout(30):
        first = asyncio.ensure_future(gw.request("POST", path, key=key, json={"title": "fire"}))
        await upstream.wait_for_held(1)  # the key's first call: sent, held, `in_flight`
        try:
            async with Run(journal, client=gw, run_id="run-km", flow_version="v1", tools=tools,
                           on_event=events.append) as run:  # fmt: skip
                with pytest.raises(ReconciliationRequired) as stopped:
                    await run.step(plan)
                assert [planned.call_id for planned in run.pending] == ["c1", "c2"]
        finally:
            upstream.release_held()
        original = await first
    error = stopped.value
    assert (error.key, error.call_id) == (key, "c1")
    problem = error.problem
    assert isinstance(problem, KeyMismatchUnsettled)
    assert isinstance(problem, KeyMismatch)
    assert (problem.status, problem.kind) == (422, "key-mismatch-unsettled")
    assert (problem.state, problem.safe_to_retry, problem.next_action) == (
        "in_flight",
        False,
        "reconcile",
    )
    assert "may have taken effect" in str(error)
    assert f"look it up at {gw.base_url}{operation_path(key)}" in str(error)
    assert [event.call_id for event in events if event.kind == "sending"] == ["c1"]
    assert (original.status, original.replayed) == (201, False)
    assert upstream.count == 1
    assert await gw.lookup(after) is None


# -- resolve ------------------------------------------------------------------------------


async def release_when_allowed(gw: GatewayClient, key: str, **options: Any) -> Any:
    """`gw.resolve(key, "not_applied")`, repeated while the gateway says too-early."""
    async with asyncio.timeout(60):
        while True:
            try:
                return await gw.resolve(key, "not_applied", **options)
            except GatewayProblem as problem:
                if problem.kind != "too-early":
                    raise
            await asyncio.sleep(0.25)


@pytest_asyncio.fixture
async def soon(
    gateway_factory: GatewayFactory, upstream: CountingUpstream, make_client: ClientFactory
) -> GatewayClient:
    """A client of a gateway whose unknown operations may be released 2 s after their
    lease ran out (`harness.RELEASE_SOON`)."""
    gateway = await gateway_factory(upstream.url, route=RELEASE_SOON, idempotency={"lease": "2s"})
    return make_client(gateway.url)


async def test_resolve_applied_makes_the_receipt_and_not_applied_releases(
    soon: GatewayClient, upstream: CountingUpstream
) -> None:
    """resolve settles unknown keys: applied -> completed (replayed), not_applied -> released."""
    gw = soon
    for key in ("ra", "rn"):
        with pytest.raises(OutcomeUnknown):
            await gw.request("POST", ISSUES + "?drop=after_effect", key=key, json={"k": key})
    unknown = await gw.lookup("ra")
    assert unknown is not None
    assert unknown.state == "unknown"
    assert not unknown.safe_to_retry
    receipt = StoredResponse(status=201, headers={"content-type": "application/json"},
                             body='{"id": "T-9"}')  # fmt: skip
    settled = await gw.resolve("ra", "applied", response=receipt, if_match=unknown.etag)
    assert (settled.state, settled.resolution and settled.resolution.by) == ("completed", "owner")
    replay = await gw.request("POST", ISSUES + "?drop=after_effect", key="ra", json={"k": "ra"})
    assert (replay.replayed, replay.json()) == (True, {"id": "T-9"})

    released = await release_when_allowed(gw, "rn")
    assert released.state == "released"
    with pytest.raises(UpstreamConnectionLost):  # forwarded again (and lost again)
        await gw.request("POST", ISSUES + "?drop=after_effect", key="rn", json={"k": "rn"})
    assert upstream.count == 3


async def test_a_not_applied_resolve_too_early_is_too_early_and_keeps_the_key_unknown(
    gw: GatewayClient, upstream: CountingUpstream
) -> None:
    """409 too-early (a KeyConflict) names when the release is accepted, in `allowed_at` and
    Retry-After, and never suggests forcing it; the key stays unknown and is not resent."""
    with pytest.raises(OutcomeUnknown):
        await gw.request("POST", ISSUES + "?drop=after_effect", key="te", json={})
    operation = await gw.lookup("te")
    assert operation is not None
    with pytest.raises(TooEarly) as early:
        await gw.resolve("te", "not_applied", note="nothing in the ticket list yet")
    problem = early.value
    assert isinstance(problem, KeyConflict)
    assert (problem.status, problem.kind, problem.key) == (409, "too-early", "te")
    assert (problem.state, problem.safe_to_retry) == (
        "unknown",
        True,
    )  # the same resolve, after Retry-After
    assert problem.allowed_at == (operation.model_extra or {})["not_applied_allowed_at"]
    assert problem.last_send_age is not None
    assert 0 <= problem.last_send_age < 60
    assert problem.retry_after is not None
    assert problem.retry_after > 60  # at least the route's 60 s timeout is still to come
    assert "force" not in problem.detail
    after = await gw.lookup("te")
    assert after is not None
    assert (after.state, after.etag) == ("unknown", operation.etag)
    with pytest.raises(OutcomeUnknown):
        await gw.request("POST", ISSUES + "?drop=after_effect", key="te", json={})
    assert upstream.count == 1


async def test_resolve_problems(soon: GatewayClient, upstream: CountingUpstream) -> None:
    """Resolve raises UnknownKey, PreconditionFailed, NotResolvable and InvalidRequest."""
    gw = soon
    with pytest.raises(UnknownKey) as unknown_key:
        await gw.resolve("nobody", "not_applied")
    assert unknown_key.value.status == 404
    with pytest.raises(OutcomeUnknown):
        await gw.request("POST", ISSUES + "?drop=after_effect", key="rp", json={})
    operation = await gw.lookup("rp")
    assert operation is not None
    assert operation.etag is not None
    bad_encoding = {"status": 201, "body": "not base64!", "body_encoding": "base64"}
    with pytest.raises(InvalidRequest) as invalid:
        await gw.resolve("rp", "applied", response=bad_encoding)
    assert invalid.value.status == 400
    with pytest.raises(TooEarly) as early:
        await gw.resolve("rp", "not_applied", if_match=operation.etag)
    assert early.value.retry_after is not None
    await asyncio.sleep(early.value.retry_after)
    with pytest.raises(PreconditionFailed) as stale:
        await gw.resolve("rp", "not_applied", if_match=operation.etag.replace(".", ".9"))
    assert stale.value.status == 412
    await release_when_allowed(gw, "rp", if_match=operation.etag)
    with pytest.raises(NotResolvable) as done:
        await gw.resolve("rp", "not_applied")
    assert (done.value.status, done.value.state) == (409, "released")


# -- transport and the paused gateway ---------------------------------------------------------


async def test_an_unreachable_gateway_is_a_connection_error(
    make_client: ClientFactory, refused_port: int
) -> None:
    """No gateway listening: GatewayConnectionError, marked safe to retry when keyed."""
    client = make_client(f"http://127.0.0.1:{refused_port}")
    with pytest.raises(GatewayConnectionError) as caught:
        await client.request("POST", ISSUES, key="gone", json={})
    assert caught.value.safe_to_retry is True
    assert isinstance(caught.value.__cause__, Exception)


@pytest.mark.slow
async def test_lease_lost_from_a_gateway_paused_before_sending(
    processes: list[GatewayProcess],
    tmp_path: Path,
    upstream: CountingUpstream,
    make_client: ClientFactory,
) -> None:
    """503 lease-lost (a gateway frozen past its lease never sent) raises LeaseLost."""
    options: dict[str, Any] = {"idempotency": {"lease": "1s", "sweep_interval": "60s"}}
    process = spawn(processes, tmp_path, upstream.url, fault="pause_after_claim", **options)
    assert process.process is not None
    client = make_client(process.url)
    request = asyncio.create_task(client.request("POST", ISSUES, key="paused", json={}))
    async with asyncio.timeout(60):  # the fault stops the process itself after the claim
        while True:
            if is_stopped(process.process.pid):
                break
            await asyncio.sleep(0.02)
    await asyncio.sleep(1.5)  # past the 1 s lease
    process.kill(signal.SIGCONT)
    with pytest.raises(LeaseLost) as caught:
        await request
    assert (caught.value.status, caught.value.safe_to_retry) == (503, True)
    assert caught.value.state == "released"
    assert upstream.count == 0


async def test_a_too_early_resolve_is_not_repeated_by_the_client(
    gateway_factory: GatewayFactory, upstream: CountingUpstream, make_client: ClientFactory
) -> None:
    """`too-early` is safe to repeat, but its Retry-After (a few seconds here) is for the
    person to check the tool again: a client that retries whatever is safe to retry
    still raises it rather than sending the same verdict for them once the time has come."""
    gateway = await gateway_factory(upstream.url, route=RELEASE_SOON, idempotency={"lease": "2s"})
    patient = make_client(gateway.url, backoff=Backoff(attempts=20, total=120.0))
    with pytest.raises(OutcomeUnknown):
        await patient.request("POST", ISSUES + "?drop=after_effect", key="tx", json={"k": "tx"})
    with pytest.raises(TooEarly) as early:
        await patient.resolve("tx", "not_applied")
    assert early.value.safe_to_retry is True
    assert early.value.next_action == "wait"
    still = await patient.lookup("tx")
    assert still is not None
    assert still.state == "unknown"
