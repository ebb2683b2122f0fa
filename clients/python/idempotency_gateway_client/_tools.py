"""How a model's tool call becomes an HTTP request through the gateway, and what plans.

The request is computed once, when the plan is saved, and stored with it: a
retry after a restart sends the stored request, so a code change between two
processes cannot change the bytes (and the fingerprint) of an effect already
on its way.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from idempotency_gateway_client._records import ToolCall, ToolRequest, Turn

__all__ = ["HttpTool", "Planner", "Tool"]

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


@dataclass(frozen=True)
class HttpTool:
    """A tool that is one HTTP endpoint behind the gateway: the arguments are the JSON body.

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
        return ToolRequest(
            method=self.method.upper(),
            path=self.path,
            json=dict(call.arguments),
            headers=dict(self.headers),
        )
