"""A gateway that holds secrets keeps them out of core files, debuggers and other users' reach.

The admin token, the encryption and history keys, a store password and the
tool APIs' credentials (`upstream_headers`) live in the process's memory. A
core file (a crash, `gcore`) or another user's ptrace would copy them out; a
config file readable by every user on the host hands them over directly.
"""

from __future__ import annotations

import ctypes
import logging
import resource
import stat
import sys
import tomllib
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from pathlib import Path

    from gateway.config import Settings

log = logging.getLogger("gateway.serve")

_PR_SET_DUMPABLE = 4


def holds_secrets(settings: Settings) -> bool:
    """Whether the configuration puts a secret in this process's memory.

    >>> from gateway.config import Settings
    >>> admin = {"token": "Zq4-7hL2pW9xR1vT8mK3nB6c"}
    >>> holds_secrets(Settings()), holds_secrets(Settings(admin=admin))
    (False, True)
    """
    store = settings.store
    return bool(
        settings.admin.enabled
        or store.encryption_keys
        or store.history_key is not None
        or urlsplit(store.url).password
        or any(route.upstream_headers for route in settings.routes)
    )


def protect_secrets(settings: Settings, config_file: Path | None = None) -> None:
    """No core file and no ptrace by other users while secrets are held (Linux), and a
    warning when the config file that may hold them is readable by other users."""
    if not holds_secrets(settings):
        return
    try:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (ValueError, OSError) as exc:  # pragma: no cover - a hard limit set lower
        log.warning("could not turn core files off: %s", exc)
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:  # pragma: no cover
            log.warning("could not make the process non-dumpable")
    if config_file is not None:
        warn_if_shared(config_file)


def written_secrets(document: dict[str, Any]) -> bool:
    """Whether a config document holds a secret written out (not a `${VAR}` reference).

    >>> written_secrets({"admin": {"token": ""}}), written_secrets({"admin": {"token": "x"}})
    (False, True)
    >>> written_secrets({"routes": [{"upstream_headers": {"A": "Bearer ${TOKEN}"}}]})
    False
    """

    def written(value: object) -> bool:
        return isinstance(value, str) and bool(value) and "${" not in value

    admin, store = document.get("admin", {}), document.get("store", {})
    candidates: list[object] = [admin.get("token"), store.get("history_key")]
    candidates += list(store.get("encryption_keys", []))
    url = store.get("url")
    if isinstance(url, str) and "${" not in url and urlsplit(url).password:
        return True
    for route in document.get("routes", []):
        candidates += list((route.get("upstream_headers") or {}).values())
        candidates += list(((route.get("probe") or {}).get("headers") or {}).values())
    return any(written(value) for value in candidates)


def warn_if_shared(config_file: Path) -> None:
    """Warn (once, at start) when other users on the host may read a config file that
    holds a secret written out."""
    try:
        mode = config_file.stat().st_mode
        document = tomllib.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if mode & (stat.S_IROTH | stat.S_IWOTH) and written_secrets(document):
        log.warning(
            "the config file %s holds secrets and other users can read it: chmod o-rwx it, "
            "or keep the secrets in the environment (${VAR})",
            config_file,
            extra={"event": "config_readable_by_others"},
        )
