"""Reading the configuration: the TOML file, environment overrides, flags.

`gateway.config.settings` says what a valid setting is; this module gathers the raw
values from where operators put them and turns pydantic's `ValidationError`
into one `ConfigError` whose lines name the dotted key, the bad value (masked
when it may be a secret) and where it came from (the file, an environment
variable, a flag). It is, with the header validators, the only code that
reads `os.environ`.

Precedence, lowest first: built-in defaults, the TOML file, environment
variables `IDEMPOTENCY_GATEWAY_<SECTION>__<KEY>`, then `overrides` (command
line flags and tests). `${VAR}` in upstream and probe header values is
replaced from the environment at load time, so secrets never sit in the file;
`render_effective` masks them again for display.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

from pydantic import BaseModel, ValidationError

from gateway.config.fields import (
    _SECRET_KEYS,
    _dotted,
    _Loc,
    _mask_refused_url,
    _Problems,
)
from gateway.config.settings import Settings
from gateway.engine.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

__all__ = [
    "ACTOR_ENV_VAR",
    "CONFIG_ENV_VAR",
    "DEFAULT_CONFIG_PATH",
    "ENV_PREFIX",
    "config_error_message",
    "load_settings",
]

ENV_PREFIX = "IDEMPOTENCY_GATEWAY_"
CONFIG_ENV_VAR = "IDEMPOTENCY_GATEWAY_CONFIG"
ACTOR_ENV_VAR = "IDEMPOTENCY_GATEWAY_ACTOR"
"""Who an operator's CLI calls are from (`X-Admin-Actor`): the CLI's, not a setting."""
NOT_SETTINGS = frozenset({CONFIG_ENV_VAR, ACTOR_ENV_VAR})
"""Variables with the settings' prefix that name no setting."""
DEFAULT_CONFIG_PATH = Path("config/gateway.toml")


def load_settings(
    path: str | os.PathLike[str] | None = None,
    *,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    require_routes: bool = False,
) -> Settings:
    """Read, merge and validate the configuration, or raise `ConfigError`.

    The file is `path`, else `$IDEMPOTENCY_GATEWAY_CONFIG`, else
    `config/gateway.toml` when it exists (else built-in defaults, no routes).
    Environment variables override the file; `overrides` (dotted keys such as
    `"server.port"` or `"routes[0].timeout"`) override both.

    `require_routes` is for serving (and `check-config`, which answers for
    serving): a gateway without routes answers 404 to every request, which
    looks like a broken network rather than a missing file, so it is refused
    with the file that was looked for. The operator commands read the same
    config only for the admin address and need no routes.

    >>> load_settings(environ={}, overrides={"server.port": 9999}).server.port
    9999
    """
    env = os.environ if environ is None else environ
    file = config_file(path, env)
    data: dict[str, Any] = _read_toml(file) if file is not None else {}
    origin = str(file) if file is not None else "built-in defaults (no config file)"
    if "testing" in data:
        raise ConfigError(
            f"invalid configuration in {origin}:\n  testing: test-only settings can only be "
            f"set through the environment ({ENV_PREFIX}TESTING__FAULT)"
        )
    sources: dict[_Loc, str] = {}
    for name in sorted(env):
        if name.startswith(ENV_PREFIX) and name not in NOT_SETTINGS:
            source = f"environment variable {name}"
            loc = _env_loc(name, source)
            sources[_assign(data, loc, _env_value(env[name], source), source)] = source
    for key, value in (overrides or {}).items():
        source = f"override {key!r}"
        sources[_assign(data, _override_loc(key, source), value, source)] = source
    try:
        settings = Settings.model_validate(data, context={"environ": env})
    except ValidationError as exc:
        raise ConfigError(_describe(exc, origin, sources)) from exc
    if require_routes and not settings.routes:
        raise ConfigError(_no_routes(file))
    return settings


def config_error_message(error: ConfigError) -> str:
    """The one text a command prints for `error`, under exactly one "invalid configuration".

    Validation errors already open with "invalid configuration in FILE:";
    the loader's other refusals (a missing file, bad TOML) do not.

    >>> config_error_message(ConfigError("x.toml: not valid TOML"))
    'invalid configuration: x.toml: not valid TOML'
    """
    if error.detail.startswith("invalid configuration"):
        return error.detail
    return f"invalid configuration: {error.detail}"


def _no_routes(file: Path | None) -> str:
    if file is None:
        return (
            f"invalid configuration: no routes configured: looked for {DEFAULT_CONFIG_PATH} "
            f"in {Path.cwd()} (not found); pass --config PATH or set {CONFIG_ENV_VAR}"
        )
    return (
        f"invalid configuration: no routes configured: {file} has no [[routes]] table, "
        "so every request would get 404"
    )


def config_file(path: str | os.PathLike[str] | None, env: Mapping[str, str]) -> Path | None:
    """The config file `load_settings` reads: `path`, else the one named by the
    environment, else `config/gateway.toml` when it exists (None: defaults only)."""
    if path is not None:
        explicit, how = Path(path), "the config file"
    elif env.get(CONFIG_ENV_VAR):
        explicit, how = Path(env[CONFIG_ENV_VAR]), f"the config file named by {CONFIG_ENV_VAR}"
    elif DEFAULT_CONFIG_PATH.is_file():
        return DEFAULT_CONFIG_PATH
    else:
        return None
    if not explicit.is_file():
        raise ConfigError(f"{how} {str(explicit)!r} does not exist or is not a file")
    return explicit


def _read_toml(file: Path) -> dict[str, Any]:
    try:
        with file.open("rb") as handle:
            return tomllib.load(handle)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file}: not valid TOML: {exc}") from exc
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read the config file: {exc}") from exc


def _env_loc(name: str, source: str) -> _Loc:
    parts = name.removeprefix(ENV_PREFIX).lower().split("__")
    if not all(parts):
        raise ConfigError(f"{source}: expected {ENV_PREFIX}<SECTION>__<KEY>")
    return tuple(int(part) if part.isdigit() else part for part in parts)


def _env_value(value: str, source: str) -> Any:
    if value.strip().startswith(("[", "{")):
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{source}: looks like JSON but is not valid: {exc}") from exc
    return value


def _override_loc(key: str, source: str) -> _Loc:
    loc: list[str | int] = []
    for piece in key.split("."):
        match = re.fullmatch(r"([^\[\]]+)((?:\[[0-9]+\])*)", piece)
        if match is None:
            raise ConfigError(f"{source}: expected a dotted key such as 'routes[0].timeout'")
        name = match[1]
        loc.append(int(name) if name.isdigit() else name)
        loc.extend(int(index) for index in re.findall(r"[0-9]+", match[2]))
    return tuple(loc)


def _assign(data: dict[str, Any], loc: _Loc, value: Any, source: str) -> _Loc:
    """Set `value` at `loc` inside the parsed file; return the loc as stored."""
    container: Any = data
    stored: list[str | int] = []
    for depth, part in enumerate(loc):
        last = depth == len(loc) - 1
        if isinstance(container, dict):
            # Env names are upper-case: match a table key whatever its case.
            key = next((k for k in container if k.lower() == str(part).lower()), str(part))
            if last:
                container[key] = value
            else:
                container = container.setdefault(key, [] if isinstance(loc[depth + 1], int) else {})
            stored.append(key)
        elif isinstance(container, list) and isinstance(part, int) and part < len(container):
            if last:
                container[part] = value
            else:
                container = container[part]
            stored.append(part)
        else:
            where = _dotted(tuple(stored)) or "the top level"
            raise ConfigError(f"{source}: cannot set {_dotted(loc)}: no such entry in {where}")
    return tuple(stored)


def _describe(exc: ValidationError, origin: str, sources: Mapping[_Loc, str]) -> str:
    """One line per problem: dotted key, what is wrong, the bad value, its source."""
    lines = [f"invalid configuration in {origin}:"]
    for loc, message in _problems(exc):
        source = next(
            (sources[loc[:n]] for n in range(len(loc), 0, -1) if loc[:n] in sources),
            # An unknown section set from the environment: name the variables under it.
            ", ".join(s for key, s in sources.items() if loc and key[: len(loc)] == loc),
        )
        suffix = f" [from {source}]" if source else ""
        lines.append(f"  {_dotted(loc) or '(top level)'}: {message}{suffix}")
    return "\n".join(lines)


def _problems(exc: ValidationError) -> Iterator[tuple[_Loc, str]]:
    for error in exc.errors():
        loc: _Loc = tuple(error["loc"])
        cause = error.get("ctx", {}).get("error")
        if isinstance(cause, _Problems):
            for sub, message in cause.problems:
                yield loc + sub, message
            continue
        kind, value = error["type"], error["input"]
        if kind == "missing":
            yield loc, "required key is missing"
        elif kind == "extra_forbidden":
            known = _known_keys(loc[:-1])
            yield loc, "unknown key" + (f" (known keys: {', '.join(known)})" if known else "")
        else:
            message = error["msg"].removeprefix("Value error, ")
            shown = repr(_masked(loc, value))
            yield loc, message if shown in message else f"{message} (got {shown})"


def _masked(loc: _Loc, value: Any) -> Any:
    if _SECRET_KEYS.intersection(part for part in loc if isinstance(part, str)):
        return "***"
    # A refused value is shown to say what was wrong, never what may be a secret in it.
    return _mask_refused_url(value) if isinstance(value, str) and "://" in value else value


def _known_keys(loc: _Loc) -> list[str]:
    model: type[BaseModel] | None = Settings
    for part in loc:
        if isinstance(part, str) and model is not None:
            field = model.model_fields.get(part)
            model = _model_in(field.annotation) if field is not None else None
    return sorted(model.model_fields) if model is not None else []


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        if (found := _model_in(arg)) is not None:
            return found
    return None
