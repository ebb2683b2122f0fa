"""Showing the effective configuration: a small TOML emitter that masks secrets.

Operators need to see what the gateway will actually run with once the file,
the environment and the flags are merged (`idempotency-gateway check-config`), without
the output leaking tokens or upstream credentials. `render_effective` writes
the settings back as TOML that `load_settings` accepts, durations and sizes
in their shortest exact form and every secret as `"***"`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, BeforeValidator, SecretStr

from gateway.config.fields import _BARE_KEY_RE, _SECRET_KEYS, _mask_url
from gateway.config.loader import ENV_PREFIX
from gateway.config.routes import MCP_ONLY, STDIO_ONLY, RouteSettings
from gateway.config.sections import TestingSettings
from gateway.config.settings import Settings
from gateway.config.units import format_duration, format_size, parse_duration, parse_size

__all__ = ["render_effective"]


def render_effective(settings: Settings) -> str:
    """The effective configuration as TOML, secrets masked as `"***"`.

    Durations and sizes are written in their shortest exact form; the text
    parses back (with tomllib or `load_settings`) to the same settings, apart
    from the masked secrets.

    >>> render_effective(Settings()).splitlines()[4:7]
    ['[server]', 'host = "127.0.0.1"', 'port = 8080']
    """
    lines = ['# Effective configuration; secrets are masked as "***".']
    _emit_table(lines, settings, "")
    if settings.testing.fault is not None:
        lines += [
            "",
            f"# testing.fault = {_toml_value(settings.testing.fault)} is ARMED "
            f"(test-only fault injection, set through {ENV_PREFIX}TESTING__FAULT)",
        ]
    return "\n".join(lines) + "\n"


def _emit_table(lines: list[str], model: BaseModel, path: str) -> None:
    tables: list[tuple[str, list[BaseModel], bool]] = []
    # An HTTP route has no MCP-only keys, an MCP route on a URL no stdio keys, and a stdio
    # route no upstream: printing their defaults would say they have.
    skipped: tuple[str, ...] = ()
    if isinstance(model, RouteSettings):
        if model.kind == "http":
            skipped = MCP_ONLY
        elif model.command is None:
            skipped = STDIO_ONLY
        else:
            skipped = ("upstream",)
    for name, field in type(model).model_fields.items():
        value = getattr(model, name)
        dotted = f"{path}.{name}" if path else name
        if value is None or name in skipped or (isinstance(value, TestingSettings) and not path):
            continue
        if isinstance(value, BaseModel):
            tables.append((dotted, [value], False))
        elif value and isinstance(value, tuple) and isinstance(value[0], BaseModel):
            tables.append((dotted, list(value), True))
        else:
            if isinstance(value, SecretStr):
                value = "***" if value.get_secret_value() else ""
            elif name in _SECRET_KEYS and isinstance(value, tuple):
                value = ["***"] * len(value)
            elif (name in _SECRET_KEYS or name == "env") and isinstance(value, dict):
                # A stdio server's environment is where its credentials go.
                value = dict.fromkeys(value, "***")
            elif _validated_by(field.metadata, parse_duration):
                value = format_duration(value)
            elif _validated_by(field.metadata, parse_size):
                value = format_size(value)
            elif isinstance(value, str):
                value = _mask_url(value)
            lines.append(f"{_toml_key(name)} = {_toml_value(value)}")
    for dotted, models, is_array in tables:
        for nested in models:
            lines += ["", f"[[{dotted}]]" if is_array else f"[{dotted}]"]
            _emit_table(lines, nested, dotted)


def _validated_by(metadata: list[Any], func: object) -> bool:
    return any(isinstance(item, BeforeValidator) and item.func is func for item in metadata)


def _toml_key(key: str) -> str:
    return key if _BARE_KEY_RE.fullmatch(key) else _toml_value(key)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, Path):
        value = str(value)
    if isinstance(value, str):
        escaped = "".join(_toml_char(char) for char in value)
        return f'"{escaped}"'
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    if isinstance(value, dict):
        if not value:
            return "{}"
        items = ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items())
        return "{ " + items + " }"
    raise TypeError(f"cannot render {value!r} as TOML")


def _toml_char(char: str) -> str:
    if char in ('"', "\\"):
        return "\\" + char
    if char < " " or char == "\x7f":
        return {"\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(char, f"\\u{ord(char):04X}")
    return char
