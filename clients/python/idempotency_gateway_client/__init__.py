"""Agent-side client for the idempotency gateway.

Stable keys (`derive_key`), calls that turn gateway problems into typed
exceptions (`GatewayClient`), lookups of what happened to an effect
(`GatewayClient.lookup`), and a durable run journal (`Run` over a
`FileJournal` or `SqliteJournal`) that follows the recovery protocol, for
HTTP tools (`HttpTool`) and for tools of an MCP server behind the gateway
(`McpTool`, with the optional `mcp` extra).

>>> async with GatewayClient("http://127.0.0.1:8080") as gw:
...     async with Run(FileJournal("run-77.json"), client=gw, run_id="run-77",
...                    flow_version="triage-v1", tools=TOOLS) as run:
...         while not run.finished:
...             await run.step(plan)
"""

from __future__ import annotations

from idempotency_gateway_client._backoff import Backoff
from idempotency_gateway_client._client import GatewayClient, canonical_json
from idempotency_gateway_client._events import EventKind, RunEvent, RunObserver
from idempotency_gateway_client._exceptions import (
    BadRequest,
    CallUnconfirmed,
    ClientNotAllowed,
    GatewayClientError,
    GatewayConnectionError,
    GatewayProblem,
    IncompatibleJournal,
    InProgress,
    InvalidKey,
    InvalidRequest,
    JournalCorrupt,
    JournalError,
    KeyConflict,
    KeyFormatError,
    KeyMismatch,
    KeyMismatchUnsettled,
    LeaseLost,
    MethodNotAllowed,
    MissingCredentials,
    MissingKey,
    NoRoute,
    NotFound,
    NotResolvable,
    OutcomeUnknown,
    PayloadTooLarge,
    PreconditionFailed,
    QuotaExceeded,
    ReceiptExpired,
    ReceiptNotRetained,
    ReconciliationRequired,
    RequestTimeout,
    RoleForbidden,
    RouteSaturated,
    RunLeased,
    RunLeaseLost,
    SimilarOperation,
    StoreUnavailable,
    TooEarly,
    Unauthorized,
    Unavailable,
    UnknownKey,
    UpstreamConnectionLost,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from idempotency_gateway_client._file_journal import FileJournal
from idempotency_gateway_client._journal import JournalStore, Worker
from idempotency_gateway_client._keys import (
    MAX_KEY_LENGTH,
    derive_key,
    operation_path,
    validate_key,
)
from idempotency_gateway_client._mcp import McpSession, McpTool, mcp_result, mcp_tool_result
from idempotency_gateway_client._models import (
    Evidence,
    Operation,
    OperationState,
    Resolution,
    Response,
    SimilarTwin,
    StoredResponse,
)
from idempotency_gateway_client._records import (
    JournalDocument,
    PlannedCall,
    RunLease,
    ToolCall,
    ToolRequest,
    ToolResult,
    Turn,
)
from idempotency_gateway_client._run import Run
from idempotency_gateway_client._sqlite_journal import SqliteJournal
from idempotency_gateway_client._tools import HttpTool, Planner, SendingTool, Tool

__version__ = "0.1.0"

__all__ = [
    "MAX_KEY_LENGTH",
    "Backoff",
    "BadRequest",
    "CallUnconfirmed",
    "ClientNotAllowed",
    "EventKind",
    "Evidence",
    "FileJournal",
    "GatewayClient",
    "GatewayClientError",
    "GatewayConnectionError",
    "GatewayProblem",
    "HttpTool",
    "InProgress",
    "IncompatibleJournal",
    "InvalidKey",
    "InvalidRequest",
    "JournalCorrupt",
    "JournalDocument",
    "JournalError",
    "JournalStore",
    "KeyConflict",
    "KeyFormatError",
    "KeyMismatch",
    "KeyMismatchUnsettled",
    "LeaseLost",
    "McpSession",
    "McpTool",
    "MethodNotAllowed",
    "MissingCredentials",
    "MissingKey",
    "NoRoute",
    "NotFound",
    "NotResolvable",
    "Operation",
    "OperationState",
    "OutcomeUnknown",
    "PayloadTooLarge",
    "PlannedCall",
    "Planner",
    "PreconditionFailed",
    "QuotaExceeded",
    "ReceiptExpired",
    "ReceiptNotRetained",
    "ReconciliationRequired",
    "RequestTimeout",
    "Resolution",
    "Response",
    "RoleForbidden",
    "RouteSaturated",
    "Run",
    "RunEvent",
    "RunLease",
    "RunLeaseLost",
    "RunLeased",
    "RunObserver",
    "SendingTool",
    "SimilarOperation",
    "SimilarTwin",
    "SqliteJournal",
    "StoreUnavailable",
    "StoredResponse",
    "TooEarly",
    "Tool",
    "ToolCall",
    "ToolRequest",
    "ToolResult",
    "Turn",
    "Unauthorized",
    "Unavailable",
    "UnknownKey",
    "UpstreamConnectionLost",
    "UpstreamTimeout",
    "UpstreamUnreachable",
    "Worker",
    "canonical_json",
    "derive_key",
    "mcp_result",
    "mcp_tool_result",
    "operation_path",
    "validate_key",
]
