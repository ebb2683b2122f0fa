"""The `idempotency-gateway` command line: serve, check-config, operations.

Imports the server lazily so `check-config` stays fast and never opens a store.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from collections.abc import Sequence
from typing import Any

from gateway.cli import operations, probes
from gateway.config import load_settings, render_effective
from gateway.config.loader import config_error_message, config_file
from gateway.engine.errors import ConfigError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="idempotency-gateway",
        description="An idempotency reverse proxy for AI agents' tool calls.",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="serve the gateway")
    serve.add_argument("--config", help="TOML config file (default config/gateway.toml)")
    serve.add_argument("--host", help="listen address (overrides server.host)")
    serve.add_argument("--port", type=int, help="listen port (overrides server.port)")

    check = commands.add_parser("check-config", help="validate and print the effective config")
    check.add_argument("--config", help="TOML config file (default config/gateway.toml)")

    commands.add_parser(
        "token", help="print a fresh admin token (256 random bits, URL-safe) to paste"
    )

    operations.register(commands)
    probes.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command in ("operations", "probes"):
        return operations.run(args)
    if args.command == "token":
        print(secrets.token_urlsafe(32))
        return 0

    overrides: dict[str, Any] = {}
    if getattr(args, "host", None) is not None:
        overrides["server.host"] = args.host
    if getattr(args, "port", None) is not None:
        overrides["server.port"] = args.port
    try:
        # check-config answers "would this serve?": no routes is invalid for both.
        settings = load_settings(args.config, overrides=overrides, require_routes=True)
    except ConfigError as exc:
        print(f"idempotency-gateway: {config_error_message(exc)}", file=sys.stderr)
        return 2

    for warning in settings.warnings():
        print(f"idempotency-gateway: warning: {warning}", file=sys.stderr)
    if args.command == "check-config":
        sys.stdout.write(render_effective(settings))
        return 0

    from gateway.web.serve import run

    return run(settings, config_file=config_file(args.config, os.environ))
