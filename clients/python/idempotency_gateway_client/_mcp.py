"""`McpTool`: a run's tool calls through an MCP session (the official `mcp` SDK) and the gateway.

An agent that talks to its tools over MCP gets the same protocol as over
HTTP. The session is opened on the gateway's MCP route (`kind = "mcp"`), and
`Run` plans, keys, records and resumes exactly as for an `HttpTool`:

- the plan stores the call as the gateway will record it: method
  `tools/call`, path the tool's name, the arguments as the body;
- the call is sent with `_meta.idempotencyKey` = the run's key
  (`run_id:turn:call_id`), the gateway's key for MCP calls (the SDKs set
  `_meta` per call, not HTTP headers);
- after a crash, a call without a saved result is looked up
  (`GET /operations/<key>`, over `GatewayClient`, which must carry the same
  scope credential as the session) before anything is resent: a completed
  call's receipt is the JSON-RPC answer, so nothing is sent twice.

The gateway answers what it refuses as a tool result with `isError: true`
and the problem in `_meta.idempotency` (an SDK would hide an HTTP error
body); this module turns it back into the package's typed exceptions, so
`unknown` stops the run with `ReconciliationRequired` as over HTTP.

`mcp` is an optional dependency (`pip install 'idempotency-gateway-client[mcp]'`):
it is imported only when an MCP call is actually sent or converted, so the
rest of the package works without it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol, cast

from idempotency_gateway_client._backoff import Backoff
from idempotency_gateway_client._client import canonical_json
from idempotency_gateway_client._exceptions import (
    PROBLEM_CLASSES,
    CallUnconfirmed,
    GatewayProblem,
)
from idempotency_gateway_client._problems import PROBLEM_BASE_URI
from idempotency_gateway_client._records import PlannedCall, ToolCall, ToolRequest, ToolResult

if TYPE_CHECKING:
    from mcp.types import CallToolResult, RequestParamsMeta

    from idempotency_gateway_client._models import Operation

__all__ = [
    "KEY_META",
    "MCP_METHOD",
    "McpSession",
    "McpTool",
    "mcp_receipt",
    "mcp_result",
    "mcp_tool_result",
]

MCP_METHOD: Final = "tools/call"
"""The method of every MCP operation at the gateway (its path is the tool's name)."""

KEY_META: Final = "idempotencyKey"
"""The `params._meta` member that carries a call's idempotency key."""

_REPLAYED_META: Final = "idempotencyReplayed"
_STATE_META: Final = "idempotency"
_OWNED_META: Final = (_REPLAYED_META, _STATE_META)
"""`_meta` members only the gateway writes (it strips an upstream's copies)."""

_JSON_HEADERS: Final = {"content-type": "application/json"}

_STATUS_OF: Final = {
    "missing-key": 400,
    "invalid-key": 400,
    "invalid-request": 400,
    "request-timeout": 408,
    "payload-too-large": 413,
    "unauthorized": 401,
    "client-not-allowed": 403,
    "no-route": 404,
    "unknown-key": 404,
    "key-mismatch": 422,
    "key-mismatch-unsettled": 422,
    "in-progress": 409,
    "receipt-expired": 409,
    "receipt-not-retained": 409,
    "outcome-unknown": 409,
    "similar-operation": 409,
    "upstream-timeout": 504,
    "upstream-connection-lost": 502,
    "quota-exceeded": 429,
    "store-unavailable": 503,
    "route-saturated": 503,
    "lease-lost": 503,
    "upstream-unreachable": 502,
}
"""The HTTP status an HTTP route gives each problem. An MCP refusal is a tool result in a
200 and its `_meta.idempotency` has no status; this keeps `GatewayProblem.status` meaningful
(and equal to what the same refusal would carry over HTTP)."""


class McpSession(Protocol):
    """What `McpTool` needs of an MCP client: `call_tool` with a per-call `_meta`.

    `mcp.Client` and `mcp.ClientSession` (SDK 2.x) both fit; open them on the
    gateway's MCP route (e.g. `http://gateway:8080/tools`) with the scope's
    credential in the HTTP headers.
    """

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        read_timeout_seconds: float | None = None,
        *,
        meta: RequestParamsMeta | None = None,
    ) -> CallToolResult:
        """Call `name` with `arguments`; `meta` goes in the request's `params._meta`."""
        ...


@dataclass(frozen=True)
class McpTool:
    """A tool of an MCP server behind the gateway, called through `session` by `Run`.

    `name` is the tool's name on the server when the model knows it by another
    (by default the model's name for it); `read_timeout` is the SDK's read
    timeout for the call (None: the session's). Refusals that say it is safe
    to retry (`in-progress`, `store-unavailable`, `route-saturated`,
    `lease-lost`, `upstream-unreachable`, `quota-exceeded`) are resent with the
    same key under `backoff`, as `GatewayClient` does over HTTP.

    >>> async with GatewayClient(url, headers=credential) as gw, mcp_client(url + "/tools") as mcp:
    ...     tools = {"create_ticket": McpTool(mcp), "send_email": McpTool(mcp)}
    ...     async with Run(journal, client=gw, run_id="run-77", flow_version="v1",
    ...                    tools=tools) as run:
    ...         while not run.finished:
    ...             await run.step(plan)
    """

    session: McpSession = field(repr=False)
    name: str | None = None
    read_timeout: float | None = None
    backoff: Backoff = field(default_factory=Backoff)

    def __post_init__(self) -> None:
        if self.name is not None and not self.name:
            raise ValueError("McpTool.name may not be empty (None: the model's name for it)")
        if self.read_timeout is not None and self.read_timeout <= 0:
            raise ValueError(f"McpTool.read_timeout must be > 0 seconds, got {self.read_timeout!r}")

    def request(self, call: ToolCall) -> ToolRequest:
        """The call as the gateway records it: `tools/call`, the tool's name, the arguments."""
        return ToolRequest(
            method=MCP_METHOD,
            path=self.name or call.name,
            json=dict(call.arguments),
        )

    async def send(self, planned: PlannedCall) -> ToolResult:
        """Call the planned tool with the planned arguments and `_meta.idempotencyKey`.

        The stored request is sent, not one rebuilt from the call: the gateway
        fingerprints the tool and its arguments, and a retry after a restart
        must be the same call. Returns the tool's answer (also an `isError`
        result: that is the tool's own failure, and final); raises the typed
        `GatewayProblem` of a gateway refusal, and `CallUnconfirmed` for an
        SDK error that may hide an answer the gateway recorded.
        """
        from mcp import MCPError  # the optional dependency, needed only here

        request = planned.request
        if request.method != MCP_METHOD:
            raise ValueError(
                f"{planned.key}: the plan sends {request.method} {request.path}, not an MCP "
                f"{MCP_METHOD}; was {planned.call.name!r} an HTTP tool when it was planned?"
            )
        arguments = request.json_body if isinstance(request.json_body, dict) else {}
        # RequestParamsMeta is an open TypedDict (extra_items=Any) that mypy reads as closed.
        meta = cast("RequestParamsMeta", {KEY_META: planned.key})
        sent = 0
        waited = 0.0
        while True:
            sent += 1
            try:
                answer = await self.session.call_tool(
                    request.path, dict(arguments), self.read_timeout, meta=meta
                )
            except MCPError as exc:
                problem = _problem_of_error(exc.data)
                if problem is None:
                    raise CallUnconfirmed(
                        f"{planned.key}: {request.path} answered an MCP error ({exc.code}: "
                        f"{exc.message}); a server's error answer, a timeout or a lost stream "
                        "look alike here, so the gateway is asked what happened",
                        key=planned.key,
                        call_id=planned.call_id,
                    ) from exc
                cause: BaseException | None = exc
            else:
                document = answer.model_dump(by_alias=True, mode="json", exclude_unset=True)
                problem = _refusal_of(document)
                if problem is None:
                    return _tool_result(
                        {"result": _without_owned_meta(document)},
                        replayed=_meta_of(document).get(_REPLAYED_META) is True,
                        source="response",
                    )
                cause = None
            delay = None
            if problem.safe_to_retry is True:
                delay = self.backoff.next_delay(sent, waited, problem.retry_after)
            if delay is None:
                raise problem from cause
            await asyncio.sleep(delay)
            waited += delay


def mcp_receipt(operation: Operation) -> ToolResult | None:
    """The result a lookup's MCP receipt stands for (`source="receipt"`); None when it is gone."""
    if operation.error is not None:
        return _tool_result({"error": operation.error}, replayed=True, source="receipt")
    if operation.result is None:
        return None
    result = operation.result
    if isinstance(result, dict):
        result = _without_owned_meta(result)
    return _tool_result({"result": result}, replayed=True, source="receipt")


def mcp_result(result: ToolResult) -> CallToolResult:
    """An MCP tool's recorded result as the SDK's `CallToolResult`, as `call_tool` returned it.

    A recorded JSON-RPC error is raised as the SDK's `MCPError`, as `call_tool`
    raised it; a result of another kind of tool is a ValueError.

    >>> mcp_result(run.turns[0].result("c1")).structured_content["id"]
    'T-1'
    """
    from mcp import MCPError
    from mcp.types import CallToolResult

    document = result.body_json()
    if not isinstance(document, dict) or not ({"result", "error"} & document.keys()):
        raise ValueError("not an MCP tool's result: its body has no 'result' or 'error'")
    error = document.get("error")
    if error is not None:
        details = error if isinstance(error, dict) else {}
        code = details.get("code")
        raise MCPError(
            code if isinstance(code, int) else -32603,
            str(details.get("message", error)),
            details.get("data"),
        )
    return CallToolResult.model_validate(document["result"])


def mcp_tool_result(answer: CallToolResult | Mapping[str, Any]) -> ToolResult:
    """A `ToolResult` for an MCP tool's answer found by hand, for `Run.record_result`.

    `answer` is the SDK's `CallToolResult` or its wire form (`content`,
    `structuredContent`, `isError`).
    """
    if isinstance(answer, Mapping):
        document = dict(answer)
    else:
        document = answer.model_dump(by_alias=True, mode="json", exclude_unset=True)
    return _tool_result({"result": _without_owned_meta(document)}, replayed=False, source="manual")


def _tool_result(
    document: dict[str, Any],
    *,
    replayed: bool,
    source: Literal["response", "receipt", "manual"],
) -> ToolResult:
    return ToolResult(
        status=200,
        headers=dict(_JSON_HEADERS),
        body=_record_json(document),
        replayed=replayed,
        state="completed",
        source=source,
    )


def _record_json(document: dict[str, Any]) -> str:
    """A tool's answer as the journal keeps it: canonical JSON, as the Node client writes it.

    What a server answered is recorded, never refused: an integer beyond what
    canonical JSON carries exactly is written with sorted keys instead.
    """
    try:
        return canonical_json(document).decode("utf-8")
    except ValueError:
        return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _meta_of(document: Mapping[str, Any]) -> dict[str, Any]:
    meta = document.get("_meta")
    return meta if isinstance(meta, dict) else {}


def _without_owned_meta(document: dict[str, Any]) -> dict[str, Any]:
    """The tool result without the gateway's own `_meta` members (kept in ToolResult fields)."""
    meta = {name: value for name, value in _meta_of(document).items() if name not in _OWNED_META}
    stripped = {name: value for name, value in document.items() if name != "_meta"}
    if meta:
        stripped["_meta"] = meta
    return stripped


def _refusal_of(document: Mapping[str, Any]) -> GatewayProblem | None:
    """The gateway's refusal, when the tool result is one (isError, `_meta.idempotency`).

    Only the gateway writes `_meta.idempotency` (it strips an upstream's), so a
    result carrying it is the gateway's, not the tool's.
    """
    problem = _meta_of(document).get(_STATE_META)
    if document.get("isError") is not True or not isinstance(problem, dict):
        return None
    return _typed(problem, status=None)


def _problem_of_error(data: object) -> GatewayProblem | None:
    """The gateway's problem in a JSON-RPC error's `data`, or None for anyone else's error.

    The gateway refuses malformed calls (no key where one is required, a bad
    request) with a JSON-RPC error whose `data` is its problem document, whose
    `type` is under the gateway's problem URI; a replay of an error receipt is
    marked `idempotencyReplayed` and is the server's, whatever it holds.
    """
    if not isinstance(data, dict) or data.get(_REPLAYED_META) is True:
        return None
    type_uri = data.get("type")
    if not isinstance(type_uri, str) or not type_uri.startswith(PROBLEM_BASE_URI):
        return None
    status = data.get("status")
    return _typed(data, status=status if isinstance(status, int) else None)


def _typed(problem: dict[str, Any], *, status: int | None) -> GatewayProblem:
    kind = str(problem.get("type", "")).rstrip("/").rsplit("/", 1)[-1]
    cls = PROBLEM_CLASSES.get(kind, GatewayProblem)
    return cls(dict(problem), status=status or _STATUS_OF.get(kind, 200))
