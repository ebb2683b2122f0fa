"""`idempotency-gateway operations ...`: operator commands against a running gateway.

The commands talk to the gateway's admin API over HTTP instead of opening the
store themselves. So they work the same with SQLite and PostgreSQL. They also
never open a database file that a gateway holds: a second process writing to
it would go around the state machine and its leases. The config file is read
only for defaults: where the admin listener is, and the admin token.

    idempotency-gateway operations list --state unknown
    idempotency-gateway operations show op_01J...
    idempotency-gateway operations show run-77:0:c1     # a key: looked up in every scope
    idempotency-gateway operations resolve op_01J... --applied --status 201 --body '{"id": 1}'
    idempotency-gateway operations resolve op_01J... --not-applied --note "not in the CRM"

Exit codes: 0 on success; 1 when the gateway answered with an error; 2 on a
usage or configuration error (a key several scopes used is one: name the
operation by id), or when the gateway cannot be reached.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shlex
import sys
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO
from urllib.parse import quote, urlsplit

from gateway.config import Settings, load_settings
from gateway.config.loader import config_error_message
from gateway.engine.errors import ConfigError
from gateway.engine.models import State

if TYPE_CHECKING:
    import aiohttp

__all__ = ["CommandFailed", "error_line", "register", "run"]

REQUEST_TIMEOUT = 30.0
"""Seconds for one admin request, connecting included."""

# Addresses a gateway listens on but a client cannot connect to.
_WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})

_TABLE_COLUMNS = ("id", "state", "route", "method", "key", "attempts", "updated_at", "scope")

_REFERENCE_HELP = (
    "operation id (op_...), or the agent's Idempotency-Key: searched in every scope; "
    "a key several scopes used asks for the id"
)

_OPERATION_ID = re.compile(r"op_[0-9A-Z]{26}")
"""What `gateway.engine.ids` mints; anything else can only be a key."""

_KEY_MATCHES = 50
"""How many of one key's operations (one per scope) a lookup by key lists at most."""

_NO_RECEIPT_MEANS = "the key stays used, nothing is replayed"

_TOKEN_HINT = "pass --token, set admin.token in the config, or set IDEMPOTENCY_GATEWAY_ADMIN__TOKEN"


class CommandFailed(Exception):
    """An operator command ends here: `message` goes to stderr, `exit_code` to the shell."""

    def __init__(self, message: str, *, exit_code: int) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


@dataclass(frozen=True)
class AdminTarget:
    """Where the admin API is and the token it takes.

    >>> AdminTarget(url="http://127.0.0.1:8080", token="s3cret")
    AdminTarget(url='http://127.0.0.1:8080', token='***')
    """

    url: str
    token: str

    def __repr__(self) -> str:
        return f"AdminTarget(url={self.url!r}, token='***')"


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `operations` command group (`list`, `show`, `resolve`) to the CLI's parser."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", help="TOML config file, read only for --url/--token defaults")
    common.add_argument(
        "--url",
        help="the admin listener's base URL (default: http://HOST:PORT from the config's "
        "[admin] host and port)",
    )
    common.add_argument(
        "--token",
        help="admin token (default: admin.token or IDEMPOTENCY_GATEWAY_ADMIN__TOKEN, "
        "which keeps it out of the process list)",
    )

    group = commands.add_parser(
        "operations", help="list, show and resolve operations through a gateway's admin API"
    )
    verbs = group.add_subparsers(dest="operations_command", required=True)

    listing = verbs.add_parser("list", parents=[common], help="list operations of every scope")
    listing.add_argument("--state", choices=[state.value for state in State])
    listing.add_argument("--limit", type=_positive_int, help="operations per page")
    listing.add_argument("--cursor", help="start at this page (printed by a previous list)")
    listing.add_argument("--all", action="store_true", help="follow pages until the last")
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    listing.set_defaults(operations_handler=_list, operations_parser=listing)

    show = verbs.add_parser("show", parents=[common], help="print one operation as JSON")
    show.add_argument("id", metavar="ID_OR_KEY", help=_REFERENCE_HELP)
    show.set_defaults(operations_handler=_show, operations_parser=show)

    resolve = verbs.add_parser(
        "resolve", parents=[common], help="settle an unknown operation by hand"
    )
    resolve.add_argument("id", metavar="ID_OR_KEY", help=_REFERENCE_HELP)
    outcome = resolve.add_mutually_exclusive_group(required=True)
    outcome.add_argument(
        "--applied", action="store_true", help="the effect happened upstream: complete it"
    )
    outcome.add_argument(
        "--not-applied",
        action="store_true",
        help="the effect did not happen: release the key so a retry is forwarded",
    )
    resolve.add_argument(
        "--status", type=_status, help="with --applied: the response status replays get"
    )
    resolve.add_argument("--body", help="with --applied --status: the response body (UTF-8)")
    resolve.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="'NAME: VALUE'",
        help="with --applied --status: a response header; repeatable",
    )
    resolve.add_argument("--note", help="why: kept with the resolution")
    resolve.set_defaults(operations_handler=_resolve, operations_parser=resolve)


def run(
    args: argparse.Namespace,
    *,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Run a parsed `operations` command and return its exit code."""
    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    parser: argparse.ArgumentParser = args.operations_parser
    if args.operations_command == "resolve":
        problem = _resolve_usage_problem(args)
        if problem:
            parser.error(problem)  # exits 2 with the usage line, like any argparse error
    handler: Callable[[_AdminClient, argparse.Namespace, TextIO, TextIO], Awaitable[None]]
    handler = args.operations_handler
    try:
        target = _target(args)
        asyncio.run(_with_client(target, lambda client: handler(client, args, out, err)))
    except CommandFailed as exc:
        print(exc.message, file=err)
        return exc.exit_code
    return 0


def resolve_body(args: argparse.Namespace) -> dict[str, Any]:
    """The JSON document `POST /admin/operations/<id>/resolve` takes, from the options."""
    body: dict[str, Any]
    if args.not_applied:
        body = {"outcome": "not_applied"}
    else:
        body = {"outcome": "applied"}
        if args.status is not None:
            body["response"] = {
                "status": args.status,
                "headers": _headers(args.header),
                "body": args.body or "",
                "body_encoding": "utf-8",
            }
    if args.note is not None:
        body["note"] = args.note
    return body


def format_table(items: list[Mapping[str, Any]]) -> str:
    """Operations as left-aligned columns under a header line, one operation a line."""
    rows = [[name.upper() for name in _TABLE_COLUMNS]]
    rows += [[_cell(item.get(name)) for name in _TABLE_COLUMNS] for item in items]
    widths = [max(len(row[column]) for row in rows) for column in range(len(_TABLE_COLUMNS))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    return "\n".join(lines) + "\n"


# Commands


async def _list(client: _AdminClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    params: dict[str, str] = {}
    if args.state:
        params["state"] = args.state
    if args.limit is not None:
        params["limit"] = str(args.limit)
    items: list[Mapping[str, Any]] = []
    cursor: str | None = args.cursor
    seen: set[str] = set()
    while True:
        page = await client.get("/admin/operations", {**params, **_cursor_param(cursor)})
        page_items, cursor = _page(page)
        items += page_items
        if not args.all or cursor is None:
            break
        if cursor in seen:  # a gateway that hands back an old cursor would loop forever
            raise CommandFailed(f"error: the gateway returned cursor {cursor!r} twice", exit_code=1)
        seen.add(cursor)
    if args.json:
        out.write(json.dumps({"items": items, "next_cursor": cursor}, indent=2) + "\n")
    else:
        out.write(format_table(items))
    if cursor is not None:
        print(
            f"more operations: add --cursor {shlex.quote(cursor)} for the next page, "
            "or --all for every page",
            file=err,
        )


async def _show(client: _AdminClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    document = await _operation(client, args.id)
    out.write(json.dumps(document, indent=2) + "\n")


async def _resolve(
    client: _AdminClient, args: argparse.Namespace, out: TextIO, err: TextIO
) -> None:
    operation = await _operation(client, args.id)
    path = f"/admin/operations/{quote(str(operation['id']), safe='')}/resolve"
    document = await client.post(path, resolve_body(args))
    out.write(json.dumps(document, indent=2) + "\n")
    if args.applied and args.status is None:
        print(
            "warning: completed without a receipt: retries of this key get 409 "
            f"receipt-not-retained ({_NO_RECEIPT_MEANS}); give --status N [--body TEXT] "
            "to store the response they should get",
            file=err,
        )


async def _operation(client: _AdminClient, reference: str) -> Mapping[str, Any]:
    """The operation `reference` names: the one with that id, else the one with that key.

    An operator often has only the key (from the agent's log). Keys are unique
    per scope, not overall, and the admin API sees every scope: a key that
    several scopes used is not guessed at; the matches are listed, to pick
    one by id.
    """
    if _OPERATION_ID.fullmatch(reference):
        path = f"/admin/operations/{quote(reference, safe='')}"
        found: Mapping[str, Any] | None = await client.get(path, missing_ok=True)
        if found is not None:
            return found
    page = await client.get("/admin/operations", {"key": reference, "limit": str(_KEY_MATCHES)})
    items, cursor = _page(page)
    # A gateway older than the key filter ignores it and lists everything: keep the key's only.
    matches = [item for item in items if item.get("key") == reference]
    if not matches:
        raise CommandFailed(
            f"error: 404 not-found: no operation has the id or key {reference!r}", exit_code=1
        )
    if len(matches) > 1 or cursor is not None:
        count = f"{len(matches)}{' or more' if cursor is not None else ''}"
        raise CommandFailed(
            f"key {reference!r} is used in {count} scopes; choose one by id:\n"
            + format_table(matches).rstrip("\n"),
            exit_code=2,
        )
    operation: Mapping[str, Any] = await client.get(
        f"/admin/operations/{quote(str(matches[0]['id']), safe='')}"
    )
    return operation


# The HTTP edge: aiohttp's exceptions become CommandFailed here and nowhere else.


class _AdminClient:
    def __init__(self, session: aiohttp.ClientSession, target: AdminTarget) -> None:
        self._session = session
        self._target = target

    async def get(
        self, path: str, params: Mapping[str, str] | None = None, *, missing_ok: bool = False
    ) -> Any:
        """The JSON answer; with `missing_ok`, `None` for a 404 instead of an error."""
        return await self._request("GET", path, params=params, missing_ok=missing_ok)

    async def post(self, path: str, body: Mapping[str, Any]) -> Any:
        return await self._request("POST", path, json_body=body)

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
            raise CommandFailed(error_line(status, reason, raw), exit_code=1)
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise CommandFailed(
                f"error: {status} {reason}: {method} {url} answered, but not with JSON "
                "(is --url a gateway?)",
                exit_code=1,
            ) from exc


async def _with_client(
    target: AdminTarget, command: Callable[[_AdminClient], Awaitable[None]]
) -> None:
    # Imported here so `serve` and `check-config` never pay for the HTTP client.
    import aiohttp

    async with aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT),
        headers={
            "Authorization": f"Bearer {target.token}",
            "Accept": "application/json, application/problem+json",
            "User-Agent": "idempotency-gateway-cli",
        },
    ) as session:
        await command(_AdminClient(session, target))


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


def _target(args: argparse.Namespace) -> AdminTarget:
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
    return AdminTarget(url=_check_url(url), token=token)


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


def _resolve_usage_problem(args: argparse.Namespace) -> str | None:
    """Why these resolve options make no sense, if they do not.

    `--applied` alone is allowed (the contract's form) and completes the key
    without a receipt; `_resolve` warns what that means for retries.
    """
    response_options = args.status is not None or args.body is not None or args.header
    if args.not_applied and response_options:
        return "--status, --body and --header go with --applied, not --not-applied"
    if args.status is None and (args.body is not None or args.header):
        return "--body and --header describe a response: give its --status too"
    for header in args.header:
        name, colon, _ = header.partition(":")
        if not colon or not name.strip() or name != name.strip():
            return f"--header {header!r}: expected 'Name: value'"
    return None


def _headers(options: list[str]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for option in options:
        name, _, value = option.partition(":")
        lower, value = name.lower(), value.strip()
        headers[lower] = f"{headers[lower]}, {value}" if lower in headers else value
    return headers


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _status(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an HTTP status, got {text!r}") from None
    if not 100 <= value <= 599:
        raise argparse.ArgumentTypeError(f"expected an HTTP status (100-599), got {text!r}")
    return value


def _cursor_param(cursor: str | None) -> dict[str, str]:
    return {"cursor": cursor} if cursor else {}


def _page(document: Any) -> tuple[list[Mapping[str, Any]], str | None]:
    if not isinstance(document, dict) or not isinstance(document.get("items"), list):
        raise CommandFailed("error: the gateway's answer has no 'items' list", exit_code=1)
    cursor = document.get("next_cursor")
    return document["items"], cursor if isinstance(cursor, str) and cursor else None


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    text = str(value)
    # Scopes and future fields are not guaranteed printable; keep the table one line a row.
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)
