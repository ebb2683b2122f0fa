"""The Python client against the shared vectors in `clients/vectors/` (read by the Node client too).

Keys, canonical JSON, the gateway's problem bodies, journal files at each step
of a run, the lease rules and the requests planned calls send: where both
clients pass the same vectors, a key one derives is the key the other derives,
a body one sends is the bytes the other sends, and a journal one writes, the
other resumes.
"""

from __future__ import annotations

import base64
import inspect
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web
from idempotency_gateway_client import (
    FileJournal,
    GatewayClient,
    HttpTool,
    JournalDocument,
    JournalError,
    KeyFormatError,
    Run,
    SimilarOperation,
    SimilarTwin,
    ToolCall,
    Worker,
    canonical_json,
    derive_key,
    operation_path,
    validate_key,
)
from idempotency_gateway_client._client import key_header
from idempotency_gateway_client._journal import fence, grant, parse_document
from idempotency_gateway_client._problems import problem_from
from multidict import CIMultiDict

from gateway.engine import errors

VECTORS = Path(__file__).resolve().parent.parent / "clients" / "vectors"


def load(name: str) -> Any:
    return json.loads((VECTORS / name).read_text(encoding="utf-8"))


KEYS = load("keys.json")
CANONICAL = load("canonical-json.json")
PROBLEMS = load("problems.json")
JOURNALS = load("journals/index.json")
LEASES = load("leases.json")
REQUESTS = load("requests.json")


@pytest.mark.parametrize("case", KEYS["derive"], ids=lambda case: repr(case)[:60])
def test_key_derivation(case: dict[str, Any]) -> None:
    if "error" in case:
        with pytest.raises(KeyFormatError):
            derive_key(case["run_id"], case["turn"], case["call_id"])
    else:
        assert derive_key(case["run_id"], case["turn"], case["call_id"]) == case["key"]


@pytest.mark.parametrize("case", KEYS["validate"], ids=lambda case: repr(case["key"])[:40])
def test_key_validation(case: dict[str, Any]) -> None:
    if case["valid"]:
        assert validate_key(case["key"]) == case["key"]
    else:
        with pytest.raises(KeyFormatError):
            validate_key(case["key"])


@pytest.mark.parametrize("case", KEYS["operation_path"], ids=lambda case: case["key"])
def test_operation_path(case: dict[str, Any]) -> None:
    assert operation_path(case["key"]) == case["path"]


@pytest.mark.parametrize("case", KEYS["header"], ids=lambda case: repr(case["key"]))
def test_key_header(case: dict[str, Any]) -> None:
    assert key_header(case["key"]) == case["header"]


@pytest.mark.parametrize("case", CANONICAL["canonical"], ids=lambda case: case["canonical"][:40])
def test_canonical_json(case: dict[str, Any]) -> None:
    assert canonical_json(case["value"]).decode("utf-8") == case["canonical"]


@pytest.mark.parametrize("case", CANONICAL["beyond_2_53"]["cases"], ids=lambda case: case["json"])
def test_canonical_json_refuses_an_int_another_client_would_read_back_differently(
    case: dict[str, Any],
) -> None:
    with pytest.raises(ValueError, match="beyond 2\\^53"):
        canonical_json(json.loads(case["json"]))


@pytest.mark.parametrize("case", PROBLEMS["cases"], ids=lambda case: case["description"][:50])
def test_problem_bodies(case: dict[str, Any]) -> None:
    problem = problem_from(case["status"], CIMultiDict(case["headers"]), case["body"].encode())
    expect = case["expect"]
    if not expect["problem"]:
        assert problem is None
        return
    assert problem is not None
    assert type(problem).__name__ == expect["class"]
    assert problem.kind == expect["kind"]
    assert problem.status == case["status"]
    assert problem.safe_to_retry == expect["safe_to_retry"]
    assert problem.next_action == expect["next_action"]
    assert problem.state == expect["state"]
    assert problem.key == expect["key"]
    assert problem.operation == expect["operation"]
    if expect["retry_after"] is None:
        assert problem.retry_after is None
    else:
        assert problem.retry_after == pytest.approx(expect["retry_after"], abs=1)
    if "similar_operation" in expect:
        assert isinstance(problem, SimilarOperation)
        twin = expect["similar_operation"]
        assert problem.similar_operation == SimilarTwin(
            twin["key"], twin["state"], twin["operation"], twin["operation_id"]
        )


@pytest.mark.parametrize("case", JOURNALS, ids=lambda case: case["file"])
def test_journal_files(case: dict[str, Any]) -> None:
    raw = (VECTORS / "journals" / case["file"]).read_bytes()
    if not case["valid"]:
        with pytest.raises(JournalError) as raised:
            parse_document(raw, case["file"])
        assert type(raised.value).__name__ == case["error"]
        return
    document = parse_document(raw, case["file"])
    assert (document.run_id, document.flow_version) == (case["run_id"], case["flow_version"])
    assert document.finished == case["finished"]
    assert len(document.turns) == case["turns"]
    pending = document.current.pending if document.current else ()
    assert [planned.key for planned in pending] == case["pending"]
    lease = document.lease
    expected_lease = case["lease"]
    assert (None if lease is None else {"holder": lease.holder, "token": lease.token}) == (
        expected_lease
    )
    results = {
        call_id: {
            "status": result.status,
            "source": result.source,
            "body_base64": base64.b64encode(result.body_bytes()).decode(),
        }
        for turn in document.turns
        for call_id, result in turn.results.items()
    }
    assert results == case["results"]
    # What this client writes back reads as the same journal (in either client).
    rewritten = parse_document(document.to_json(), "rewritten")
    assert rewritten == document
    if "defaults" not in case["file"]:
        assert json.loads(document.to_json()) == json.loads(raw)


def _document(data: dict[str, Any] | None) -> JournalDocument | None:
    return None if data is None else JournalDocument.model_validate(data)


@pytest.mark.parametrize("case", LEASES["grant"], ids=lambda case: case["description"])
def test_lease_grants(case: dict[str, Any]) -> None:
    worker = Worker(**LEASES["worker"])
    expect = case["expect"]
    arguments = (_document(case["existing"]), case["run_id"], case["flow_version"], worker)
    if "error" in expect:
        with pytest.raises(JournalError) as raised:
            grant(*arguments, now=LEASES["now"], duration=LEASES["duration"])
        assert type(raised.value).__name__ == expect["error"]
        if "holder" in expect:
            assert (raised.value.holder, raised.value.token) == (expect["holder"], expect["token"])  # type: ignore[attr-defined]
        return
    granted = grant(*arguments, now=LEASES["now"], duration=LEASES["duration"])
    assert granted.lease is not None
    assert (granted.lease.holder, granted.lease.token) == (worker.name, expect["token"])
    assert granted.lease.expires_at == expect["expires_at"]


@pytest.mark.parametrize("case", LEASES["fence"], ids=lambda case: case["description"])
def test_lease_fences(case: dict[str, Any]) -> None:
    stored, mine = _document(case["stored"]), _document(case["mine"])
    assert mine is not None
    expect = case["expect"]
    if expect.get("ok"):
        fence(stored, mine)
        return
    with pytest.raises(JournalError) as raised:
        fence(stored, mine)
    assert type(raised.value).__name__ == expect["error"]
    assert (raised.value.holder, raised.value.token) == (expect["holder"], expect["token"])  # type: ignore[attr-defined]


def test_the_problem_vectors_cover_every_problem_the_gateway_answers() -> None:
    """A problem type the gateway gains must get a vector, so both clients learn it together."""
    answered = {
        cls.problem_type
        for _, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, errors.GatewayError) and getattr(cls, "problem_type", "")
    }
    internal = {"internal-error", "invalid-config"}  # never a client's to handle by type
    covered = {case["expect"].get("kind") for case in PROBLEMS["cases"]}
    assert answered - internal <= covered, sorted(answered - internal - covered)


def test_every_gateway_problem_vector_says_what_its_type_says_to_do_next() -> None:
    """A gateway problem's `next_action` is its class's: one per problem type, in every vector
    that carries one; a body without one (an older gateway) is read as none, never guessed."""
    next_action: dict[str, str] = {}
    for _, cls in inspect.getmembers(errors, inspect.isclass):
        if issubclass(cls, errors.GatewayError) and getattr(cls, "problem_type", ""):
            assert next_action.setdefault(cls.problem_type, cls.next_action) == cls.next_action
    said: set[str] = set()
    for case in PROBLEMS["cases"]:
        expect = case["expect"]
        if not expect["problem"] or expect["kind"] not in next_action:
            continue
        if "next_action" in json.loads(case["body"]):
            assert expect["next_action"] == next_action[expect["kind"]], case["description"]
            said.add(expect["kind"])
        else:
            assert expect["next_action"] is None, case["description"]
    internal = {"internal-error", "invalid-config"}
    assert set(next_action) - internal <= said, sorted(set(next_action) - internal - said)


# -- what a planned call sends -----------------------------------------------------------------


@pytest_asyncio.fixture
async def recorder() -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """A stand-in gateway on loopback: every lookup is 404 `unknown-key` (never sent), every
    other request is recorded as the vectors write it down and answered 200."""
    received: list[dict[str, Any]] = []

    async def handle(request: web.Request) -> web.Response:
        if request.path.startswith("/operations/"):
            problem = {"type": "https://idempotency-gateway.dev/problems/unknown-key"}
            return web.json_response(problem, status=404, content_type="application/problem+json")
        body = await request.read()
        received.append(
            {
                "method": request.method,
                "target": request.raw_path,
                "body": body.decode("utf-8") if body else None,
                "content_type": request.headers.get("Content-Type"),
            }
        )
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    yield f"http://{host}:{port}", received
    await runner.cleanup()


def _planned_journal(request: dict[str, Any]) -> bytes:
    """A journal whose one planned call, not yet sent, has `request` as the vector writes it."""
    planned = {
        "call": {"call_id": "c1", "name": "tool", "arguments": {}},
        "key": "run-v:0:c1",
        "request": request,
    }
    turn = {"index": 0, "calls": [planned], "results": {}, "planned_at": 1764583201.25}
    document = {"format": 1, "run_id": "run-v", "flow_version": "v1", "turns": [turn]}
    return json.dumps(document).encode()


@pytest.mark.parametrize("case", REQUESTS["cases"], ids=lambda case: case["description"][:60])
async def test_planned_requests(
    case: dict[str, Any], recorder: tuple[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    """An HttpTool's plan, and the request a run resuming that plan sends, byte for byte."""
    if "tool" in case:
        tool = HttpTool(**case["tool"])
        call = ToolCall(call_id="c1", name="tool", arguments=case["arguments"])
        if case.get("refused") == "plan":
            with pytest.raises(ValueError, match="no body"):
                tool.request(call)
            return
        assert tool.request(call).model_dump(mode="json", by_alias=True) == case["request"]
    url, received = recorder
    path = tmp_path / "run.json"
    path.write_bytes(_planned_journal(case["request"]))
    async with (
        GatewayClient(url) as client,
        Run(
            FileJournal(path),
            client=client,
            run_id="run-v",
            flow_version="v1",
            tools={"tool": HttpTool("POST", "/unused")},
        ) as run,
    ):
        if case.get("refused") == "send":
            with pytest.raises(ValueError, match="no body"):
                await run.step(lambda turns: [])
        else:
            await run.step(lambda turns: [])
            assert run.finished
    assert received == ([] if "refused" in case else [case["sent"]])
