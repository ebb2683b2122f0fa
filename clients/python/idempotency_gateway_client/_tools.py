"""How a model's tool call becomes a request through the gateway, and what plans.

The request is computed once, when the plan is saved, and stored with it: a
retry after a restart sends the stored request, so a code change between two
processes cannot change the bytes (and the fingerprint) of an effect already
on its way. `Run` sends an `HttpTool`'s request with `GatewayClient.request`;
a `SendingTool` (an `McpTool`) sends the stored request itself, over its own
session, with the same key.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from idempotency_gateway_client._client import BODILESS_METHODS
from idempotency_gateway_client._records import PlannedCall, ToolCall, ToolRequest, ToolResult, Turn

__all__ = ["HttpTool", "Planner", "SendingTool", "Tool"]

Planner = Callable[[tuple[Turn, ...]], Awaitable[Sequence[ToolCall]] | Sequence[ToolCall]]
"""Asks the model for the next turn's calls, given every finished turn; no calls: the run is done.

It is called at most once per turn whose plan reaches the journal: a restart
resumes the saved plan and never asks the model to choose again.
"""


class Tool(Protocol):
    """Turns one call of this tool into the request to send through the gateway.

    An implementation must be deterministic (the same call gives the same
    request) and must not perform the effect itself: `Run` sends the request,
    with the call's key, after the plan is saved.
    """

    def request(self, call: ToolCall) -> ToolRequest:
        """The request for `call`; raise ValueError for arguments the tool cannot take."""
        ...


@runtime_checkable
class SendingTool(Tool, Protocol):
    """A tool that sends its stored request itself rather than through `GatewayClient.request`.

    For transports the HTTP client cannot speak (an MCP session: `McpTool`).
    `Run` calls `send` with the planned call (its key and the request saved
    in the plan) wherever it would have sent the request, and keeps every
    other rule: the lookup before any resend, the result saved before the
    next call. `send` must send `planned.request` with `planned.key`, and
    report what came back as `Run` expects of the HTTP path:

    - the tool's answer: return it as a `ToolResult` (`source="response"`);
    - a gateway refusal: raise its typed `GatewayProblem` (`OutcomeUnknown`,
      `ReceiptExpired` and `ReceiptNotRetained` then stop the run with
      `ReconciliationRequired`; on `SimilarOperation` the run stops, or calls
      `send` again with the twin's key as `planned.key`);
    - an answer it cannot read: raise `CallUnconfirmed`, and `Run` looks the
      key up at once.
    """

    async def send(self, planned: PlannedCall) -> ToolResult:
        """Send `planned.request` with `planned.key`; the tool's answer as a `ToolResult`."""
        ...


@dataclass(frozen=True)
class HttpTool:
    """A tool that is one HTTP endpoint behind the gateway: the arguments are the JSON body.

    A GET or HEAD has no body (`BODILESS_METHODS`): its request is the path as
    written (query included) with `json` None, and a call with arguments is a
    ValueError when the plan is made, since there is no body to carry them; a
    tool of your own can put them in the path. Other methods (DELETE too) send
    the arguments, `{}` when there are none.

    >>> tools = {"create_ticket": HttpTool("POST", "/tickets/v1/issues")}
    >>> tools["create_ticket"].request(ToolCall(call_id="c1", name="create_ticket",
    ...                                         arguments={"title": "x"})).path
    '/tickets/v1/issues'
    """

    method: str
    path: str
    headers: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.path.startswith("/"):
            raise ValueError(f"HttpTool.path must start with '/', got {self.path!r}")

    def request(self, call: ToolCall) -> ToolRequest:
        method = self.method.upper()
        if method in BODILESS_METHODS and call.arguments:
            raise ValueError(
                f"{call.name}: a {method} request has no body to carry the arguments "
                f"{sorted(call.arguments)}; put them in the path with a tool of your own"
            )
        body = None if method in BODILESS_METHODS else dict(call.arguments)
        return ToolRequest(method=method, path=self.path, json=body, headers=dict(self.headers))
