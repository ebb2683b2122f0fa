"""Typed application keys: where the app factory keeps what handlers share."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from gateway.config import Settings
from gateway.engine.engine import IdempotencyEngine
from gateway.engine.exchange import RequestTrace
from gateway.engine.quotas import ScopeQuotas
from gateway.engine.request_lines import RequestRecorder
from gateway.engine.scopes import ScopeResolver
from gateway.mcp.cancellations import Cancellations
from gateway.mcp.derived_keys import DerivedKeys
from gateway.mcp.hints import ReadOnlyHints
from gateway.mcp.known_calls import KnownCalls
from gateway.mcp.reading import MessageReader
from gateway.mcp.sessions import SessionTags
from gateway.mcp.stdio_upstream import StdioUpstream
from gateway.proxy.routing import RouteTable
from gateway.store.base import Store
from gateway.upstream.forwarder import Forwarder
from gateway.web.metrics import GatewayMetrics
from gateway.web.offload import Offloader
from gateway.web.probe_jobs import ProbeJobs
from gateway.workers.role import RunningWorker

SETTINGS = web.AppKey("settings", Settings)
WORKER = web.AppKey("worker", RunningWorker)
"""Set when this process is one of a gateway's workers (`gateway.workers`)."""
STORE = web.AppKey("store", Store)
ENGINE = web.AppKey("engine", IdempotencyEngine)
QUOTAS = web.AppKey("quotas", ScopeQuotas)
FORWARDER = web.AppKey("forwarder", Forwarder)
METRICS = web.AppKey("metrics", GatewayMetrics)
ROUTES = web.AppKey("routes", RouteTable)
SCOPES = web.AppKey("scopes", ScopeResolver)
BACKGROUND = web.AppKey("background", set[asyncio.Task[Any]])
MCP_HINTS = web.AppKey("mcp_hints", ReadOnlyHints)
PROBE_JOBS = web.AppKey("probe_jobs", ProbeJobs)
MCP_READER = web.AppKey("mcp_reader", MessageReader)
OFFLOADER = web.AppKey("offloader", Offloader)
"""The helper process for CPU-bound work on large bodies (both front ends)."""
"""What each MCP route's server says is read-only, learned from its `tools/list` answers."""
MCP_SESSIONS = web.AppKey("mcp_sessions", SessionTags)
MCP_DERIVED_KEYS = web.AppKey("mcp_derived_keys", DerivedKeys)
REQUESTS = web.AppKey("requests", RequestRecorder)
"""Binds MCP session ids to the scope that opened them (with `[[clients]]`)."""
MCP_KNOWN_CALLS = web.AppKey("mcp_known_calls", KnownCalls)
"""MCP requests being handled or just handled (with workers, on any worker): what a
client's cancellation is matched against."""
MCP_CANCELLATIONS = web.AppKey("mcp_cancellations", Cancellations)
"""Cancellations waiting in the background for the request they name to be known."""

TRACE = web.RequestKey("trace", RequestTrace)
"""What one request's log line reports; set by the request-log middleware."""
STDIO_UPSTREAMS = web.AppKey("stdio_upstreams", Mapping[str, StdioUpstream])
"""This worker's stdio routes' upstreams (their children), by route name."""
