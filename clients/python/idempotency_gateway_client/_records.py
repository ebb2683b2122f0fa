"""What a run journal holds, as it is written to disk (pydantic: the disk is a boundary).

    JournalDocument  run id, flow version, whether the run is finished, the lease
    └── Turn         one decision of the model, saved before any of its calls runs
        ├── PlannedCall   the model's ToolCall, its key and the exact request to send
        └── ToolResult    per call id: what the tool answered, saved before the next step

Every model is frozen; a change is a new document written whole.
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "JOURNAL_FORMAT",
    "JournalDocument",
    "PlannedCall",
    "RunLease",
    "ToolCall",
    "ToolRequest",
    "ToolResult",
    "Turn",
]

JOURNAL_FORMAT = 1
"""The layout of the journal itself; a journal of another format is refused, not guessed at."""

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class ToolCall(BaseModel):
    """One tool call as the model decided it: its id, the tool's name, the arguments.

    >>> ToolCall(call_id="c1", name="create_ticket", arguments={"title": "Printer on fire"})
    """

    model_config = _FROZEN

    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)


class ToolRequest(BaseModel):
    """The request a tool call becomes, fixed in the plan so every retry sends it exactly.

    For an HTTP tool, `path` is the gateway path (with the route prefix) and
    `json` the body (None: no body, as a GET or HEAD always has). For an MCP
    tool (`McpTool`), `method` is `tools/call`, `path` the tool's name on the
    server and `json` its arguments: the method and path the gateway records
    for an MCP operation, so a lookup can be checked against the plan the
    same way.
    """

    model_config = _FROZEN

    method: str = "POST"
    path: str
    json_body: Any = Field(default=None, alias="json")
    headers: dict[str, str] = Field(default_factory=dict)


class PlannedCall(BaseModel):
    """A call of a saved plan: the model's decision plus the key and the request it maps to."""

    model_config = _FROZEN

    call: ToolCall
    key: str
    request: ToolRequest

    @property
    def call_id(self) -> str:
        return self.call.call_id


class ToolResult(BaseModel):
    """What the tool answered for one call, as recorded in the journal.

    `source` says where the result came from: `response` (this worker sent
    the call), `receipt` (a lookup after a crash found the gateway's stored
    receipt), or `manual` (recorded by hand after reconciliation). `state` is
    the key's state with that answer: `completed`, or `released` when the tool
    refused the request with one of the route's `release_statuses` (a 429,
    say): the tool's answer, but no effect.

    An MCP tool's result (`McpTool`) has status 200 and a JSON body holding
    the JSON-RPC answer as `GET /operations/<key>` shows it: `{"result":
    <the tool result>}` or `{"error": <the JSON-RPC error>}` (canonical JSON,
    the gateway's own `_meta` members removed, so a result read from a
    receipt is the same bytes as the one the call returned); `mcp_result`
    turns it back into the SDK's `CallToolResult`.
    """

    model_config = _FROZEN

    status: int
    headers: dict[str, str] = Field(default_factory=dict)
    body: str = ""
    body_encoding: Literal["utf-8", "base64"] = "utf-8"
    replayed: bool = False
    state: str | None = None
    source: Literal["response", "receipt", "manual"] = "response"
    recorded_at: float = Field(default_factory=time.time)

    @classmethod
    def from_bytes(cls, status: int, headers: dict[str, str], body: bytes, **fields: Any) -> Self:
        """A result whose body is kept as UTF-8 text when it is, else as base64."""
        try:
            return cls(status=status, headers=headers, body=body.decode("utf-8"), **fields)
        except UnicodeDecodeError:
            text = base64.b64encode(body).decode("ascii")
            return cls(status=status, headers=headers, body=text, body_encoding="base64", **fields)

    def body_bytes(self) -> bytes:
        if self.body_encoding == "base64":
            return base64.b64decode(self.body)
        return self.body.encode("utf-8")

    def body_json(self) -> Any:
        """The body parsed as JSON."""
        return json.loads(self.body_bytes())


class Turn(BaseModel):
    """One decision of the model and the results of its calls, in call order."""

    model_config = _FROZEN

    index: int = Field(ge=0)
    calls: tuple[PlannedCall, ...]
    results: dict[str, ToolResult] = Field(default_factory=dict)
    planned_at: float = Field(default_factory=time.time)

    @property
    def pending(self) -> tuple[PlannedCall, ...]:
        """The calls without a recorded result, in order."""
        return tuple(planned for planned in self.calls if planned.call_id not in self.results)

    @property
    def done(self) -> bool:
        return not self.pending

    def result(self, call_id: str) -> ToolResult:
        """The recorded result of a call; KeyError when it has none yet."""
        return self.results[call_id]


class RunLease(BaseModel):
    """Who may advance the run, until when, and the fencing token of that grant.

    The token grows every time a worker takes the run over, so a worker that
    was paused past its lease finds a newer token and stops instead of writing.
    """

    model_config = _FROZEN

    holder: str
    token: int = Field(ge=1)
    expires_at: float
    host: str
    pid: int


class JournalDocument(BaseModel):
    """The whole durable record of one run."""

    model_config = _FROZEN

    format: int = JOURNAL_FORMAT
    run_id: str
    flow_version: str
    created_at: float = Field(default_factory=time.time)
    finished: bool = False
    turns: tuple[Turn, ...] = ()
    lease: RunLease | None = None

    @property
    def current(self) -> Turn | None:
        """The last turn, or None before the first plan."""
        return self.turns[-1] if self.turns else None

    def with_turn(self, turn: Turn) -> JournalDocument:
        """This document with `turn` replacing the turn of the same index, or appended."""
        turns = [existing for existing in self.turns if existing.index != turn.index]
        turns.append(turn)
        turns.sort(key=lambda existing: existing.index)
        return self.model_copy(update={"turns": tuple(turns)})

    def to_json(self) -> bytes:
        return self.model_dump_json(by_alias=True, indent=2).encode() + b"\n"
