"""The gateway's configuration: one short import path for the models, the loader and the renderer.

Layered bottom up, each module importing only those below it: `units` and
`fields` (value types and validators), `sections` and `routes` (the models),
`settings` (the whole and its cross-checks), `loader` (file, environment,
flags) and `render` (the effective configuration, secrets masked).
"""

from __future__ import annotations

from gateway.config.fields import Duration, ForwardKey, Size
from gateway.config.loader import CONFIG_ENV_VAR, DEFAULT_CONFIG_PATH, ENV_PREFIX, load_settings
from gateway.config.render import render_effective
from gateway.config.routes import ProbeSettings, RouteSettings
from gateway.config.sections import (
    MIN_ADMIN_TOKEN_LENGTH,
    AdminSettings,
    ClientSettings,
    IdempotencySettings,
    LoggingSettings,
    QuotaSettings,
    ServerSettings,
    StoreSettings,
    TestingSettings,
)
from gateway.config.settings import GATEWAY_PATHS, Settings

__all__ = [
    "CONFIG_ENV_VAR",
    "DEFAULT_CONFIG_PATH",
    "ENV_PREFIX",
    "GATEWAY_PATHS",
    "MIN_ADMIN_TOKEN_LENGTH",
    "AdminSettings",
    "ClientSettings",
    "Duration",
    "ForwardKey",
    "IdempotencySettings",
    "LoggingSettings",
    "ProbeSettings",
    "QuotaSettings",
    "RouteSettings",
    "ServerSettings",
    "Settings",
    "Size",
    "StoreSettings",
    "TestingSettings",
    "load_settings",
    "render_effective",
]
