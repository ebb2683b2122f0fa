"""The admin API as the `operations` commands use it: where it is, the calls, references.

Everything that talks HTTP is here, so aiohttp's exceptions become
`CommandFailed` in one place; the commands (`gateway.cli.operations`,
`gateway.cli.operations_history`) only say what to ask and how to print it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

from gateway.config import Settings, load_settings
from gateway.config.loader import ACTOR_ENV_VAR, config_error_message
from gateway.engine.errors import ConfigError

if TYPE_CHECKING:
    import aiohttp

__all__ = [
    "ACTOR_ENV_VAR",
    "REQUEST_TIMEOUT",
    "AdminClient",
    "AdminError",
    "AdminTarget",
    "CommandFailed",
    "add_reference",
    "admin_target",
    "cell",
    "check_new_cursor",
    "cursor_param",
    "error_line",
    "find_operation",
    "format_table",
    "operation_path",
    "page_items",
    "positive_int",
    "with_client",
]

REQUEST_TIMEOUT = 30.0
"""Seconds for one admin request, connecting included."""

# Addresses a gateway listens on but a client cannot connect to.
_WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})

_TABLE_COLUMNS = ("id", "state", "route", "method", "key", "attempts", "updated_at", "scope")


ACTOR_MAX = 64
"""The longest `X-Admin-Actor` the gateway takes (printable ASCII only)."""

_OPERATION_ID = re.compile(r"op_[0-9A-Z]{26}")
"""What `gateway.engine.ids` mints; anything else can only be a key."""

_KEY_MATCHES = 50
"""How many of one key's operations (one per scope) a lookup by key lists at most."""

_REFERENCE_HELP = (
    "operation id (op_...), or the agent's Idempotency-Key: searched in every scope; "
    "a key several scopes used asks for the id or --scope"
)

_TOKEN_HINT = "pass --token, set admin.token in the config, or set IDEMPOTENCY_GATEWAY_ADMIN__TOKEN"


class CommandFailed(Exception):
    """An operator command ends here: `message` goes to stderr, `exit_code` to the shell."""

    def __init__(self, message: str, *, exit_code: int) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


class AdminError(CommandFailed):
    """The gateway answered with an error status: exit 1, the problem kept for commands
    that say more about one kind (a too-early resolve names its Retry-After)."""

    def __init__(
        self, message: str, *, status: int, problem: Mapping[str, Any], headers: Mapping[str, str]
    ) -> None:
        super().__init__(message, exit_code=1)
        self.status = status
        self.problem = problem
        self.headers = headers

    @property
    def kind(self) -> str:
        """The problem type's last segment (`too-early`), or "" without a problem document."""
        return str(self.problem.get("type") or "").rsplit("/", 1)[-1]


@dataclass(frozen=True)
class AdminTarget:
    """Where the admin API is, the token it takes, and who is calling (if said).

    >>> AdminTarget(url="http://127.0.0.1:8080", token="s3cret")
    AdminTarget(url='http://127.0.0.1:8080', token='***', actor=None)
    """

    url: str
    token: str
    actor: str | None = None

    def __repr__(self) -> str:
        return f"AdminTarget(url={self.url!r}, token='***', actor={self.actor!r})"


def format_table(items: list[Mapping[str, Any]]) -> str:
    """Operations as left-aligned columns under a header line, one operation a line."""
    rows = [[name.upper() for name in _TABLE_COLUMNS]]
    rows += [[cell(item.get(name)) for name in _TABLE_COLUMNS] for item in items]
    widths = [max(len(row[column]) for row in rows) for column in range(len(_TABLE_COLUMNS))]
    lines = [
        "  ".join(text.ljust(width) for text, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    return "\n".join(lines) + "\n"


# Operations by id or key


def add_reference(parser: argparse.ArgumentParser, *, optional: bool = False) -> None:
    """The ID_OR_KEY argument and the --scope that picks one of a key's operations."""
    parser.add_argument(
        "id", metavar="ID_OR_KEY", nargs="?" if optional else None, help=_REFERENCE_HELP
    )
    parser.add_argument(
        "--scope",
        help="with a key: the scope whose operation it is (the SCOPE column of list), for a "
        "key several callers used",
    )


async def find_operation(
    client: AdminClient, reference: str, scope: str | None = None
) -> Mapping[str, Any]:
    """The operation `reference` names: the one with that id, else the one with that key.

    An operator often has only the key (from the agent's log). Keys are unique
    per scope, not overall, and the admin API sees every scope: a key that
    several scopes used is not guessed at; the matches are listed, to pick
    one by id or by `scope`.
    """
    if _OPERATION_ID.fullmatch(reference):
        found: Mapping[str, Any] | None = await client.get(
            operation_path(reference), missing_ok=True
        )
        if found is not None and scope in (None, found.get("scope")):
            return found
    matches, more = await _key_matches(client, reference, scope)
    if not matches:
        where = "" if scope is None else f" in scope {scope!r}"
        raise CommandFailed(
            f"error: 404 not-found: no operation has the id or key {reference!r}{where}",
            exit_code=1,
        )
    if len(matches) > 1 or more:
        count = f"{len(matches)}{' or more' if more else ''}"
        raise CommandFailed(
            f"key {reference!r} is used in {count} scopes; choose one by id, or name its "
            "--scope:\n" + format_table(matches).rstrip("\n"),
            exit_code=2,
        )
    operation: Mapping[str, Any] = await client.get(operation_path(matches[0]))
    return operation


async def _key_matches(
    client: AdminClient, key: str, scope: str | None
) -> tuple[list[Mapping[str, Any]], bool]:
    """The operations with `key` (in `scope`, when given), and whether more may exist.

    Without a scope one page is enough to know whether the key is ambiguous;
    with one, pages are followed until that scope's operation turns up.
    """
    params = {"key": key, "limit": str(_KEY_MATCHES)}
    cursor: str | None = None
    seen: set[str] = set()
    while True:
        page = await client.get("/admin/operations", {**params, **cursor_param(cursor)})
        items, cursor = page_items(page)
        # A gateway older than the key filter ignores it and lists everything: keep the key's.
        matches = [
            item for item in items if item.get("key") == key and scope in (None, item.get("scope"))
        ]
        if scope is None or matches or cursor is None:
            return matches, scope is None and cursor is not None
        check_new_cursor(cursor, seen)


def operation_path(operation: Mapping[str, Any] | str) -> str:
    """`/admin/operations/<id>` of an operation (or an id), the id percent-encoded.

    >>> operation_path({"id": "op_1/x"})
    '/admin/operations/op_1%2Fx'
    """
    op_id = operation if isinstance(operation, str) else str(operation["id"])
    return f"/admin/operations/{quote(op_id, safe='')}"


def check_new_cursor(cursor: str, seen: set[str]) -> None:
    """Refuse a cursor handed back twice: a gateway doing that would make us loop forever."""
    if cursor in seen:
        raise CommandFailed(f"error: the gateway returned cursor {cursor!r} twice", exit_code=1)
    seen.add(cursor)


# The HTTP edge: aiohttp's exceptions become CommandFailed here and nowhere else.


class AdminClient:
    """JSON requests to the admin API; every failure is a `CommandFailed`."""

    def __init__(self, session: aiohttp.ClientSession, target: AdminTarget) -> None:
        self._session = session
        self._target = target

    async def get(
        self, path: str, params: Mapping[str, str] | None = None, *, missing_ok: bool = False
    ) -> Any:
        """The JSON answer; with `missing_ok`, `None` for a 404 instead of an error."""
        return await self._request("GET", path, params=params, missing_ok=missing_ok)

    async def post(
        self,
        path: str,
        body: Mapping[str, Any] | None = None,
        params: Mapping[str, str] | None = None,
    ) -> Any:
        """The JSON answer to a POST of `body` (none when `None`)."""
        return await self._request("POST", path, params=params, json_body=body)

    async def _request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        json_body: Mapping[str, Any] | None = None,
        missing_ok: bool = False,
    ) -> Any:
        import aiohttp
        from yarl import URL

        # `path` is already percent-encoded (ids are quoted by the commands).
        url = URL(self._target.url + path, encoded=True)
        try:
            async with self._session.request(
                method, url, params=params, json=json_body
            ) as response:
                raw = await response.read()
                status, reason = response.status, response.reason or ""
                headers = response.headers.copy()
        except TimeoutError as exc:
            raise CommandFailed(
                f"cannot reach the gateway at {self._target.url}: "
                f"no answer within {REQUEST_TIMEOUT:g}s",
                exit_code=2,
            ) from exc
        except aiohttp.ClientError as exc:
            raise CommandFailed(
                f"cannot reach the gateway at {self._target.url}: {exc}", exit_code=2
            ) from exc
        if status == 404 and missing_ok:
            return None
        if status >= 400:
            raise AdminError(
                error_line(status, reason, raw),
                status=status,
                problem=_problem(raw),
                headers=headers,
            )
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise CommandFailed(
                f"error: {status} {reason}: {method} {url} answered, but not with JSON "
                "(is --url a gateway?)",
                exit_code=1,
            ) from exc


async def with_client(
    target: AdminTarget, command: Callable[[AdminClient], Awaitable[None]]
) -> None:
    # Imported here so `serve` and `check-config` never pay for the HTTP client.
    import aiohttp

    headers = {
        "Authorization": f"Bearer {target.token}",
        "Accept": "application/json, application/problem+json",
        "User-Agent": "idempotency-gateway-cli",
    }
    if target.actor is not None:
        headers["X-Admin-Actor"] = target.actor
    async with aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT), headers=headers
    ) as session:
        await command(AdminClient(session, target))


def _problem(raw: bytes) -> Mapping[str, Any]:
    """The answer's JSON object (a problem document), or an empty one."""
    try:
        document = json.loads(raw)
    except ValueError:
        return {}
    return document if isinstance(document, dict) else {}


def error_line(status: int, reason: str, raw: bytes) -> str:
    """`error: <status> <problem type>: <detail>` from a problem document, or the best we have.

    The type, not the title: a title is the general sentence its detail
    makes specific ("Only an operation whose outcome is unknown can be
    resolved: the operation is completed; only an unknown one can be
    resolved"), so both together say it twice. Without a detail, the title.

    >>> error_line(409, "Conflict", b'{"type": "https://x/problems/not-resolvable", '
    ...            b'"title": "T", "status": 409, "detail": "it is completed"}')
    'error: 409 not-resolvable: it is completed'
    """
    try:
        problem = json.loads(raw)
    except ValueError:
        problem = None
    if isinstance(problem, dict) and problem.get("title"):
        detail = problem.get("detail")
        if detail:
            kind = str(problem.get("type") or "").rsplit("/", 1)[-1] or problem["title"]
            return f"error: {problem.get('status', status)} {kind}: {detail}"
        return f"error: {problem.get('status', status)} {problem['title']}"
    text = raw.decode("utf-8", "replace").strip()
    detail = text if len(text) <= 200 else text[:200] + "..."
    return f"error: {status} {reason}: {detail}" if detail else f"error: {status} {reason}"


# Options and defaults


def admin_target(args: argparse.Namespace) -> AdminTarget:
    url: str | None = args.url
    token: str | None = args.token
    if url is None or token is None:
        settings = _load_settings(args.config)
        if url is None:
            url = _default_url(settings.admin.host, settings.admin.port)
        if token is None:
            token = settings.admin.token.get_secret_value()
    if not token:
        raise CommandFailed(f"no admin token: {_TOKEN_HINT}", exit_code=2)
    return AdminTarget(url=_check_url(url), token=token, actor=_actor(args.actor))


def _actor(option: str | None) -> str | None:
    """Who the calls are from: --actor, else the environment's, else nobody in particular.

    >>> _actor(" alice "), _actor(""), _actor(None) is _actor(None)
    ('alice', None, True)
    """
    name = (option if option is not None else os.environ.get(ACTOR_ENV_VAR, "")).strip()
    if not name:
        return None
    if len(name) > ACTOR_MAX or not all(" " <= char <= "~" for char in name):
        source = "--actor" if option is not None else ACTOR_ENV_VAR
        raise CommandFailed(
            f"invalid {source} {name!r}: 1 to {ACTOR_MAX} printable ASCII characters "
            "(the gateway's rule for X-Admin-Actor)",
            exit_code=2,
        )
    return name


def _load_settings(path: str | None) -> Settings:
    try:
        return load_settings(path)
    except ConfigError as exc:
        raise CommandFailed(
            f"idempotency-gateway: {config_error_message(exc)}", exit_code=2
        ) from exc


def _default_url(host: str, port: int) -> str:
    """The URL that reaches the admin listener on `host:port`.

    >>> _default_url("0.0.0.0", 8080), _default_url("::1", 8080)
    ('http://127.0.0.1:8080', 'http://[::1]:8080')
    """
    if port == 0:
        raise CommandFailed(
            "the config's admin.port is 0 (the OS picks one at start): pass --url", exit_code=2
        )
    if host in _WILDCARD_HOSTS:
        host = "127.0.0.1"
    elif ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}"


def _check_url(url: str) -> str:
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises ValueError on a bad port
    except ValueError as exc:
        raise CommandFailed(f"invalid --url {url!r}: {exc}", exit_code=2) from exc
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CommandFailed(
            f"invalid --url {url!r}: expected http://HOST:PORT or https://HOST:PORT", exit_code=2
        )
    if parts.query or parts.fragment:
        raise CommandFailed(f"invalid --url {url!r}: no query or fragment, please", exit_code=2)
    return url.rstrip("/")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def cursor_param(cursor: str | None) -> dict[str, str]:
    return {"cursor": cursor} if cursor else {}


def page_items(document: Any) -> tuple[list[Mapping[str, Any]], str | None]:
    if not isinstance(document, dict) or not isinstance(document.get("items"), list):
        raise CommandFailed("error: the gateway's answer has no 'items' list", exit_code=1)
    cursor = document.get("next_cursor")
    return document["items"], cursor if isinstance(cursor, str) and cursor else None


def cell(value: Any) -> str:
    if value is None:
        return "-"
    text = str(value)
    # Scopes and future fields are not guaranteed printable; keep the table one line a row.
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)
