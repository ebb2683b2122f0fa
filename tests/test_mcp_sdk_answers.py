"""Every answer the gateway writes itself on an MCP route, as each official SDK reads it.

A refusal that an SDK cannot validate reaches the agent as a pydantic error
inside an exception group, not as the "do not call again" result it was
meant to be. So:

- a table over every problem type (a new type cannot be added without its
  row): the tool result the gateway writes for it passes the official Python
  SDK's own result validation in both protocol generations, and its one
  sentence says what is true (an unknown outcome never reads "refused");
- the same refusals and the status tool end to end, through the official
  client's transport in both generations, against a real server behind a real
  gateway (the TypeScript SDK reads the same table from
  `clients/vectors/mcp-refusals.json`, checked here to match the code).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from conftest import GatewayFactory
from harness import RunningGateway
from mcp.types import CallToolResult
from mcp_types.methods import validate_server_result
from mcp_upstream import LEGACY, MODERN, CountingMcpServer, call_with_key, mcp_client

from gateway.engine import errors
from gateway.mcp.replies import refusal_result
from gateway.mcp.sentences import SENTENCES, UNKNOWN_OUTCOME_TYPES
from gateway.web.problems import problem_document

PREFIX = "/tools"
TIMEOUT = 30
VERSIONS = ("2025-11-25", "2026-07-28")
VECTORS = Path(__file__).parents[1] / "clients" / "vectors" / "mcp-refusals.json"

UNKNOWN = "unknown outcome: may have happened, never call again"
NOT_MADE = "not made: safe to retry with the same key"
DONE = "took effect earlier: will not run again"
WAIT = "still running: wait, same key"
FIX = "the request is wrong: fix it"
SIMILAR = "the same call under another key, unsettled: never again, look the other one up"
UNSETTLED = "another call under this key, unsettled: never again, look the earlier one up"
OTHER = "not a tool call's answer"

ROWS: dict[str, str] = {
    "upstream-timeout": UNKNOWN,
    "upstream-connection-lost": UNKNOWN,
    "outcome-unknown": UNKNOWN,
    "upstream-error": UNKNOWN,
    "internal-error": UNKNOWN,
    "in-progress": WAIT,
    "similar-operation": SIMILAR,
    "receipt-expired": DONE,
    "receipt-not-retained": DONE,
    "upstream-unreachable": NOT_MADE,
    "store-unavailable": NOT_MADE,
    "route-saturated": NOT_MADE,
    "lease-lost": NOT_MADE,
    "quota-exceeded": NOT_MADE,
    "request-timeout": NOT_MADE,
    "key-mismatch": FIX,
    "key-mismatch-unsettled": UNSETTLED,
    "missing-key": FIX,
    "invalid-key": FIX,
    "invalid-request": FIX,
    "bad-request": FIX,
    "payload-too-large": FIX,
    "unsupported-transfer-coding": FIX,
    "missing-credentials": FIX,
    "unauthorized": FIX,
    "client-not-allowed": FIX,
    "role-forbidden": FIX,
    "method-not-allowed": OTHER,
    "not-found": OTHER,
    "no-route": OTHER,
    "unknown-key": OTHER,
    "not-resolvable": OTHER,
    "precondition-failed": OTHER,
    "too-early": OTHER,
    "invalid-config": OTHER,
}
"""Every problem type and what its sentence must tell the model."""


def error_classes() -> dict[str, type[errors.GatewayError]]:
    """One error class per problem type the gateway can answer with."""
    found: dict[str, type[errors.GatewayError]] = {}
    pending = [errors.GatewayError]
    while pending:
        cls = pending.pop()
        found.setdefault(cls.problem_type, cls)
        pending.extend(cls.__subclasses__())
    return found


def refusal_of(problem_type: str, version: str) -> dict[str, Any]:
    """The tool result the gateway writes for a call refused with `problem_type`."""
    cls = error_classes()[problem_type]
    error = cls("what happened, in the gateway's words")
    state = "unknown" if problem_type in UNKNOWN_OUTCOME_TYPES else None
    if state is not None:
        error.about("k-1", state, "op_1")
    problem = problem_document(error, instance=PREFIX, request_id="req-1")
    document = refusal_result(7, problem, version)
    assert document["id"] == 7
    result: dict[str, Any] = document["result"]
    return result


def sdk_reads(version: str, raw: dict[str, Any]) -> CallToolResult:
    """What the official Python SDK does with a `tools/call` result (its session checks
    the result against the negotiated version's schema, then builds the result type)."""
    validate_server_result("tools/call", version, raw)
    return CallToolResult.model_validate(raw, by_name=False)


def test_every_problem_type_has_a_row() -> None:
    assert set(ROWS) == set(error_classes()), "add the new problem type to ROWS (and a sentence)"
    assert set(SENTENCES) == set(ROWS)
    assert set(UNKNOWN_OUTCOME_TYPES) <= {kind for kind, row in ROWS.items() if row == UNKNOWN}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("problem_type", sorted(ROWS))
def test_the_refusal_is_a_result_the_sdk_accepts_and_its_sentence_is_true(
    problem_type: str, version: str
) -> None:
    result = sdk_reads(version, refusal_of(problem_type, version))
    assert result.is_error is True
    assert result.meta is not None
    assert result.meta["idempotency"]["type"] == problem_type
    [content] = result.content
    assert content.type == "text"
    text = content.text
    assert text == SENTENCES[problem_type]
    lowered = text.lower()
    row = ROWS[problem_type]
    if row == UNKNOWN:
        assert "may have done" in lowered
        assert "not under a new one" in lowered
        for false_claim in ("refused", "did not happen", "not made", "safe to retry"):
            assert false_claim not in lowered
    elif row == NOT_MADE:
        assert "not made" in lowered
        assert "retry it with the same key" in lowered
    elif row == DONE:
        assert "already took effect" in lowered
        assert "will not be run again" in lowered
    elif row == WAIT:
        assert "still running" in lowered
        assert "same key" in lowered
    elif row == SIMILAR:
        assert "not made" in lowered
        assert "not under a new one" in lowered
        assert "look the earlier call up" in lowered
    elif row == UNSETTLED:
        assert "may have taken effect" in lowered
        assert "not under a new one" in lowered
        assert "look the earlier call up" in lowered
        for false_claim in ("use a new key", "did not happen", "safe to retry"):
            assert false_claim not in lowered
    assert "force" not in lowered
    assert "distinct" not in lowered


def vectors_now() -> dict[str, Any]:
    """The refusals as the gateway writes them today, for the TypeScript SDK's test."""
    return {
        "comment": (
            "One tool result per problem type and protocol version, as the gateway writes "
            "it on an MCP route; clients/typescript/test/mcp-refusals.test.mjs parses each "
            "with the official TypeScript SDK. Regenerate with "
            "`.venv/bin/python tests/test_mcp_sdk_answers.py`; tests/test_mcp_sdk_answers.py "
            "fails while this file differs from what the gateway writes."
        ),
        "rows": {kind: ROWS[kind] for kind in sorted(ROWS)},
        "results": {
            version: {kind: refusal_of(kind, version) for kind in sorted(ROWS)}
            for version in VERSIONS
        },
    }


def test_the_typescript_vectors_match_what_the_gateway_writes() -> None:
    """The TypeScript SDK reads these; a changed sentence or a new type changes them."""
    assert json.loads(VECTORS.read_text()) == vectors_now(), (
        "regenerate: .venv/bin/python tests/test_mcp_sdk_answers.py"
    )


# End to end: the official client's transport, a real gateway, a real server.


@pytest_asyncio.fixture
async def server() -> AsyncIterator[CountingMcpServer]:
    async with CountingMcpServer() as started:
        yield started


async def gateway_for(
    gateway_factory: GatewayFactory, server: CountingMcpServer, **options: Any
) -> RunningGateway:
    route = {
        "name": "tools",
        "prefix": PREFIX,
        "upstream": server.url,
        "kind": "mcp",
        "status_tool": "operation_status",
        **options,
    }
    return await gateway_factory(server.url, route=route)


def idempotency(result: CallToolResult) -> dict[str, Any]:
    assert result.meta is not None, result
    value: dict[str, Any] = result.meta["idempotency"]
    return value


@pytest.mark.parametrize("mode", [LEGACY, MODERN])
async def test_refusals_and_the_status_tool_reach_the_agent_in_both_generations(
    gateway_factory: GatewayFactory, server: CountingMcpServer, mode: str
) -> None:
    """key-mismatch, a lost connection, its retry and the status tool: each a result
    the SDK hands over, never a validation error; one effect in all."""
    gateway = await gateway_for(gateway_factory, server)
    url = gateway.url + PREFIX
    async with asyncio.timeout(TIMEOUT), mcp_client(url, mode=mode) as client:
        await call_with_key(client, "create_ticket", {"title": "one"}, f"{mode}-a")
        mismatch = await call_with_key(client, "create_ticket", {"title": "two"}, f"{mode}-a")
        assert mismatch.is_error
        assert idempotency(mismatch)["type"] == "key-mismatch"

        lost = await call_with_key(client, "lose_connection", {"title": "x"}, f"{mode}-b")
        assert lost.is_error
        assert (idempotency(lost)["type"], idempotency(lost)["state"]) == (
            "upstream-connection-lost",
            "unknown",
        )
        assert lost.content[0].text == SENTENCES["upstream-connection-lost"]
        retry = await call_with_key(client, "lose_connection", {"title": "x"}, f"{mode}-b")
        assert idempotency(retry)["type"] == "outcome-unknown"

        asked = await client.call_tool("operation_status", {"key": f"{mode}-b"})
        assert asked.is_error is False
        assert asked.structured_content is not None
        assert asked.structured_content["state"] == "unknown"
        done = await client.call_tool("operation_status", {"key": f"{mode}-a"})
        assert done.structured_content is not None
        assert done.structured_content["state"] == "completed"
        never = await client.call_tool("operation_status", {"key": "never-used"})
        assert never.structured_content == {"key": "never-used", "state": None}
    assert server.count == 2  # one ticket, one lost-connection effect


@pytest.mark.parametrize(("first", "then"), [(LEGACY, MODERN), (MODERN, LEGACY)])
async def test_a_receipt_recorded_in_one_generation_replays_in_the_other(
    gateway_factory: GatewayFactory, server: CountingMcpServer, first: str, then: str
) -> None:
    gateway = await gateway_for(gateway_factory, server)
    url = gateway.url + PREFIX
    async with asyncio.timeout(TIMEOUT):
        async with mcp_client(url, mode=first) as client:
            made = await call_with_key(client, "create_ticket", {"title": "x"}, "cross-gen")
        async with mcp_client(url, mode=then) as client:
            again = await call_with_key(client, "create_ticket", {"title": "x"}, "cross-gen")
    assert again.structured_content == made.structured_content
    assert again.meta is not None
    assert again.meta["idempotencyReplayed"] is True
    assert server.count == 1


if __name__ == "__main__":
    VECTORS.write_text(json.dumps(vectors_now(), indent=2, ensure_ascii=False) + "\n")
