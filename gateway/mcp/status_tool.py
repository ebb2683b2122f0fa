"""The optional status tool: the model asks whether an earlier call happened.

With `status_tool = "operation_status"`, the gateway adds that tool to the
server's `tools/list` answers and answers it itself from the store, in the
caller's scope. A model that lost track of a call (a restart, a timeout) can
then ask instead of calling again. It is read-only: never protected,
recorded or forwarded. A server that already lists a tool of that name keeps
it: the gateway then adds nothing and passes calls to it through.
"""

from __future__ import annotations

from typing import Any

from gateway.engine.models import Operation, State
from gateway.mcp.calls import ToolCall, derived_key, tool_call_of
from gateway.mcp.jsonrpc import INVALID_PARAMS, JsonRpcError, Message, parse_object
from gateway.web.operation_json import safe_to_retry

__all__ = ["definition", "key_asked_about", "status_result"]

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


def key_asked_about(route: str, call: ToolCall) -> str:
    """The key to look up: `key`, or the derived key of `tool` with `arguments`."""
    arguments = call.arguments
    key = arguments.get("key")
    if isinstance(key, str) and key:
        return key
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
        return derived_key(route, tool_call_of(message, header_keys=[]))
    raise JsonRpcError(INVALID_PARAMS, 'give "key", or "tool" and "arguments"')


def status_result(key: str, operation: Operation | None) -> dict[str, Any]:
    """The tool result: one sentence for the model, the facts as structured content."""
    if operation is None:
        text = (
            f"No call with key {key!r} is known in your scope: it was never made through "
            "this gateway, or it is older than the gateway remembers."
        )
        return _result(text, {"key": key, "state": None})
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
