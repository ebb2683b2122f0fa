"""Typed application keys: where the app factory keeps what handlers share."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from gateway.config import Settings
from gateway.exchange import RequestTrace
from gateway.forwarder import Forwarder
from gateway.lifecycle import IdempotencyEngine
from gateway.metrics import GatewayMetrics
from gateway.routing import RouteTable
from gateway.scopes import ScopeResolver
from gateway.store.base import Store

SETTINGS = web.AppKey("settings", Settings)
STORE = web.AppKey("store", Store)
ENGINE = web.AppKey("engine", IdempotencyEngine)
FORWARDER = web.AppKey("forwarder", Forwarder)
METRICS = web.AppKey("metrics", GatewayMetrics)
ROUTES = web.AppKey("routes", RouteTable)
SCOPES = web.AppKey("scopes", ScopeResolver)
BACKGROUND = web.AppKey("background", set[asyncio.Task[Any]])

TRACE = web.RequestKey("trace", RequestTrace)
"""What one request's log line reports; set by the request-log middleware."""
