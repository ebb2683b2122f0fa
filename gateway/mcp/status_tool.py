"""The optional status tool: the model asks whether an earlier call happened.

With `status_tool = "operation_status"`, the gateway adds that tool to the
server's `tools/list` answers and answers it itself from the store, in the
caller's scope. A model that lost track of a call (a restart, a timeout) can
then ask instead of calling again. It is read-only: never protected,
recorded or forwarded. A server that already lists a tool of that name keeps
it: the gateway then adds nothing and passes calls to it through.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from gateway.engine.models import Operation, State
from gateway.mcp.calls import ToolCall, fingerprint_call, tool_call_of
from gateway.mcp.jsonrpc import INVALID_PARAMS, JsonRpcError, Message, parse_object
from gateway.web.operation_json import safe_to_retry

__all__ = ["StatusQuestion", "asked_about", "definition", "in_words", "status_result"]

_SENTENCES = {
    State.IN_FLIGHT: "The call is still running; wait, then retry it with the same key.",
    State.COMPLETED: "The call took effect; its result is below. Do not call it again.",
    State.RELEASED: (
        "The call never took effect (the tool refused it or never received it); it is "
        "safe to call it again with the same key."
    ),
    State.UNKNOWN: (
        "Nobody knows yet whether the call took effect. Do not call it again, not even "
        "under a new id; ask the user or an operator to check the tool."
    ),
}


def definition(name: str) -> dict[str, Any]:
    """The tool as `tools/list` shows it."""
    return {
        "name": name,
        "description": (
            "Whether an earlier tool call made through this gateway took effect, and its "
            "result. Give the idempotency key the call was made with, or the tool name and "
            "the exact arguments of a call made without a key."
        ),
        "inputSchema": {
            "type": "object",
            "properties": {
                "key": {"type": "string", "description": "the call's idempotency key"},
                "tool": {"type": "string", "description": "the tool called without a key"},
                "arguments": {"type": "object", "description": "that call's arguments"},
            },
        },
        "annotations": {"readOnlyHint": True, "title": "Status of an earlier tool call"},
    }


class StatusQuestion(NamedTuple):
    """What the model asked about: a call by its key, or by its tool and arguments (then
    the call's fingerprint, which finds it under whatever key it was made)."""

    key: str | None = None
    tool: str | None = None
    fingerprint: str | None = None
    """The call's plain fingerprint (`fingerprint_call`), keyed in the caller's scope
    where the scope is known."""


def asked_about(route: str, call: ToolCall) -> StatusQuestion:
    """What a status call asks: `key`, or `tool` with `arguments` (their fingerprint)."""
    arguments = call.arguments
    key = arguments.get("key")
    if isinstance(key, str) and key:
        return StatusQuestion(key=key)
    tool = arguments.get("tool")
    if isinstance(tool, str) and tool:
        asked = arguments.get("arguments") or {}
        if not isinstance(asked, dict):
            raise JsonRpcError(INVALID_PARAMS, "arguments.arguments must be an object")
        message = Message(
            "request",
            {},
            id=call.id,
            method="tools/call",
            params={"name": tool, "arguments": asked},
        )
        asked_call = tool_call_of(message, header_keys=[])
        return StatusQuestion(
            tool=tool,
            fingerprint=fingerprint_call(route, asked_call),
        )
    raise JsonRpcError(INVALID_PARAMS, 'give "key", or "tool" and "arguments"')


def in_words(seconds: float) -> str:
    """A lifetime as a person says it.

    >>> in_words(600), in_words(86400), in_words(30 * 86400), in_words(90)
    ('10 minutes', '24 hours', '30 days', '90 seconds')
    """
    for unit, size in (("days", 86400), ("hours", 3600), ("minutes", 60)):
        if (
            seconds >= size * 2
            and seconds % size == 0
            and not (unit == "days" and seconds < 2 * 86400)
        ):
            count = int(seconds // size)
            return f"{count} {unit if count != 1 else unit[:-1]}"
    return f"{seconds:g} seconds"


def status_result(
    question: StatusQuestion, operation: Operation | None, *, remembered: float
) -> dict[str, Any]:
    """The tool result: one sentence for the model, the facts as structured content.

    `remembered` is the shortest time a call of this route is remembered (the derived
    keys' retention where the route derives them): "never made" is only ever said of
    that span, and only when no operation of the call exists in it.
    """
    if operation is None:
        span = in_words(remembered)
        if question.key is not None:
            text = (
                f"No call with key {question.key!r} was made through this gateway in your "
                f"scope in the last {span} (it may be older than that)."
            )
        else:
            text = (
                f"No call of {question.tool} with these arguments was made through this "
                f"gateway in your scope in the last {span}, under any key (it may be older "
                "than that)."
            )
        return _result(text, {"key": question.key, "state": None})
    key = operation.key
    facts: dict[str, Any] = {
        "key": key,
        "state": operation.state.value,
        "operation": operation.id,
        "tool": operation.path,
        "safe_to_retry": safe_to_retry(operation),
    }
    if operation.state is State.COMPLETED and operation.receipt_available():
        stored = operation.response
        try:
            document = parse_object(stored.body) if stored is not None else None
        except JsonRpcError:  # a receipt kept as bytes the parser cannot read: not shown
            document = None
        if isinstance(document, dict):
            facts["result"] = document.get("result", document.get("error"))
    return _result(_SENTENCES[operation.state], facts)


def _result(text: str, facts: dict[str, Any]) -> dict[str, Any]:
    return {
        "content": [{"type": "text", "text": text}],
        "structuredContent": facts,
        "isError": False,
    }
