"""`idempotency-gateway operations ...`: operator commands against a running gateway.

The commands talk to the gateway's admin API over HTTP instead of opening the
store themselves. So they work the same with SQLite and PostgreSQL. They also
never open a database file that a gateway holds: a second process writing to
it would go around the state machine and its leases. The config file is read
only for defaults: where the admin listener is, and the admin token.

    idempotency-gateway operations list --state unknown
    idempotency-gateway operations search run-77:           # key, id or forwarded-key prefix
    idempotency-gateway operations show op_01J...
    idempotency-gateway operations show run-77:0:c1     # a key: looked up in every scope
    idempotency-gateway operations resolve op_01J... --applied --status 201 --body '{"id": 1}'
    idempotency-gateway operations resolve op_01J... --not-applied --note "not in the CRM"
    idempotency-gateway operations history run-77:0:c1 --scope client:billing
    idempotency-gateway operations verify --all
    idempotency-gateway operations probe --route tickets
    idempotency-gateway operations redact op_01J... --reason "GDPR request 12"

Every call names who makes it (`X-Admin-Actor`) when `--actor` or
IDEMPOTENCY_GATEWAY_ACTOR says so: the history records it as `admin:<name>`.

Exit codes: 0 on success; 1 when the gateway answered with an error; 2 on a
usage or configuration error (a key several scopes used is one: name the
operation by id or --scope), or when the gateway cannot be reached; 3 when
`verify` finds a broken history chain; 4 when `probe --route` gives up
waiting (the job goes on in the gateway).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TextIO

from gateway.cli import operations_attach, operations_history
from gateway.cli.admin_client import (
    ACTOR_ENV_VAR,
    AdminClient,
    AdminError,
    CommandFailed,
    add_reference,
    admin_target,
    cell,
    check_new_cursor,
    cursor_param,
    error_line,
    find_operation,
    format_table,
    operation_path,
    page_items,
    positive_int,
    with_client,
)
from gateway.cli.confirm import confirm_by_key, no_terminal_problem
from gateway.cli.receipt_options import add_receipt_arguments, receipt_document, receipt_problem
from gateway.engine.models import State

__all__ = [
    "CommandFailed",
    "error_line",
    "register",
    "resolve_body",
    "run",
    "too_early_message",
]

_NO_RECEIPT_MEANS = "the key stays used, nothing is replayed"


def common_options() -> argparse.ArgumentParser:
    """The options every admin command takes: where the admin API is, its token, who asks."""
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
    common.add_argument(
        "--actor",
        help=f"who you are: sent as X-Admin-Actor, so the history records admin:ACTOR "
        f"(default: {ACTOR_ENV_VAR}, when set)",
    )
    return common


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `operations` command group to the CLI's parser: `list`, `search`, `show` and
    `resolve` here, `history`, `verify`, `probe` and `redact` in `operations_history`."""
    common = common_options()

    group = commands.add_parser(
        "operations",
        help="list, search, show, resolve, audit and probe operations through a gateway's "
        "admin API",
    )
    verbs = group.add_subparsers(dest="operations_command", required=True)

    listing = verbs.add_parser("list", parents=[common], help="list operations of every scope")
    _add_paging(listing)
    listing.set_defaults(operations_handler=_list, operations_parser=listing)

    search = verbs.add_parser(
        "search",
        parents=[common],
        help="list the operations whose key, id or forwarded key starts with TEXT",
    )
    search.add_argument("text", metavar="TEXT", help="a prefix; % and _ are plain characters")
    _add_paging(search)
    search.set_defaults(
        operations_handler=_search, operations_parser=search, operations_usage=_search_problem
    )

    show = verbs.add_parser("show", parents=[common], help="print one operation as JSON")
    add_reference(show)
    show.set_defaults(operations_handler=_show, operations_parser=show)

    _register_resolve(verbs, common)
    operations_attach.register(verbs, common)
    operations_history.register(verbs, common)


def _add_paging(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--state", choices=[state.value for state in State])
    parser.add_argument("--route", help="only operations of this route")
    parser.add_argument("--limit", type=positive_int, help="operations per page")
    parser.add_argument("--cursor", help="start at this page (printed by a previous command)")
    parser.add_argument("--all", action="store_true", help="follow pages until the last")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _register_resolve(
    verbs: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    resolve = verbs.add_parser(
        "resolve",
        parents=[common],
        help="settle an unknown operation by hand",
        description="Settle an unknown operation: --applied completes it (with the response "
        "retries should get), --not-applied releases its key so a retry is forwarded. The "
        "gateway refuses --not-applied (409 too-early, with a Retry-After) while the tool may "
        "still apply the last send.",
    )
    add_reference(resolve)
    outcome = resolve.add_mutually_exclusive_group(required=True)
    outcome.add_argument(
        "--applied", action="store_true", help="the effect happened upstream: complete it"
    )
    outcome.add_argument(
        "--not-applied",
        action="store_true",
        help="the effect did not happen: release the key so a retry is forwarded",
    )
    add_receipt_arguments(resolve, when="with --applied: ")
    resolve.add_argument(
        "--no-receipt",
        action="store_true",
        help="with --applied: complete it without a response. Retries then get 409 "
        "receipt-not-retained until a receipt is attached (operations attach)",
    )
    resolve.add_argument("--note", help="why (required): kept verbatim in the operation's history")
    resolve.add_argument(
        "--share-with-owner",
        action="store_true",
        help="with --note: the key's owner sees the note in GET /operations/<key> (by "
        "default an owner sees that an admin resolved, not the note)",
    )
    resolve.add_argument(
        "--force",
        action="store_true",
        help="with --not-applied: release even while the tool may still apply the last send "
        "(the gateway's too-early refusal). Only when you know the effect cannot happen any "
        "more, e.g. the upstream's owner confirmed it: a late effect after a retry is a "
        "duplicate. The history records the force. Asks you to type the key unless --yes; "
        "without a terminal, --yes is required",
    )
    resolve.add_argument(
        "--yes", action="store_true", help="with --force: do not ask for confirmation"
    )
    resolve.set_defaults(
        operations_handler=_resolve,
        operations_parser=resolve,
        operations_usage=_resolve_usage_problem,
    )


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
    usage: Callable[[argparse.Namespace], str | None] | None
    usage = getattr(args, "operations_usage", None)
    if usage is not None and (problem := usage(args)):
        parser.error(problem)  # exits 2 with the usage line, like any argparse error
    handler: Callable[[AdminClient, argparse.Namespace, TextIO, TextIO], Awaitable[None]]
    handler = args.operations_handler
    try:
        target = admin_target(args)
        asyncio.run(with_client(target, lambda client: handler(client, args, out, err)))
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
            body["response"] = receipt_document(args)
    if args.note is not None:
        body["note"] = args.note
    # Sent only when asked: a gateway without them refuses unknown members.
    if args.share_with_owner:
        body["share_with_owner"] = True
    if args.force:
        body["force"] = True
    return body


# Commands


async def _list(client: AdminClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    await _print_listing(client, args, out, err, {})


async def _search(client: AdminClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    await _print_listing(client, args, out, err, {"q": args.text})


async def _print_listing(
    client: AdminClient,
    args: argparse.Namespace,
    out: TextIO,
    err: TextIO,
    params: dict[str, str],
) -> None:
    """`list` and `search`: the same pages, one table (or JSON), a hint when more follow."""
    for name in ("state", "route"):
        if getattr(args, name):
            params[name] = getattr(args, name)
    if args.limit is not None:
        params["limit"] = str(args.limit)
    items: list[Mapping[str, Any]] = []
    cursor: str | None = args.cursor
    seen: set[str] = set()
    while True:
        page = await client.get("/admin/operations", {**params, **cursor_param(cursor)})
        found, cursor = page_items(page)
        items += found
        if not args.all or cursor is None:
            break
        check_new_cursor(cursor, seen)
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


async def _show(client: AdminClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    document = await find_operation(client, args.id, args.scope)
    out.write(json.dumps(document, indent=2) + "\n")


async def _resolve(client: AdminClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    operation = await find_operation(client, args.id, args.scope)
    if args.force and not args.yes:
        confirm_by_key(operation, force_question(operation), "nothing was released", err)
    try:
        document = await client.post(f"{operation_path(operation)}/resolve", resolve_body(args))
    except AdminError as exc:
        if exc.status == 409 and exc.kind == "too-early":
            message = too_early_message(exc)
            if operation.get("probe_available") is True:  # the way not to wait, as the console's
                message += (
                    f"\nor ask the tool now: idempotency-gateway operations probe {operation['id']}"
                )
            raise CommandFailed(message, exit_code=1) from exc
        raise
    out.write(json.dumps(document, indent=2) + "\n")
    if args.no_receipt:
        print(
            "note: completed without a receipt: retries of this key get 409 "
            f"receipt-not-retained ({_NO_RECEIPT_MEANS}) until one is attached: "
            "operations attach ID --status N [--body TEXT]",
            file=err,
        )


def force_question(operation: Mapping[str, Any]) -> str:
    """What a forced release risks, said before it is sent.

    >>> print(force_question({"id": "op_1", "key": "k", "state": "unknown"}))
    This releases op_1 (key 'k', unknown) with force: the tool may still be applying its last send, and the agent's retry is forwarded as soon as it comes (a late effect is then a duplicate). The force is recorded in the history.
    """  # noqa: E501
    return (
        f"This releases {cell(operation.get('id'))} (key {operation.get('key')!r}, "
        f"{cell(operation.get('state'))}) with force: the tool may still be applying its last "
        "send, and the agent's retry is forwarded as soon as it comes (a late effect is then "
        "a duplicate). The force is recorded in the history."
    )


def too_early_message(error: AdminError) -> str:
    """The gateway's too-early refusal as it gave it, and when a release will be accepted
    (the instant once: not again when the gateway's words name it).

    The remedy is waiting: the tool may still apply the last send until then,
    and a retry forwarded before that could apply the effect twice.

    >>> error = AdminError("error: 409 too-early: the tool may still apply it", status=409,
    ...     problem={"allowed_at": "2026-12-02T06:25:30Z", "last_send_age": 60.2},
    ...     headers={"Retry-After": "240"})
    >>> print(too_early_message(error))
    error: 409 too-early: the tool may still apply it
    retry after 240 s (at 2026-12-02T06:25:30Z); the last send was 60 s ago
    """
    retry_after = error.headers.get("Retry-After")
    if retry_after is None:
        return error.message
    when = f"{retry_after} s" if retry_after.isdigit() else retry_after
    line = f"retry after {when}"
    allowed_at = error.problem.get("allowed_at")
    if allowed_at and str(allowed_at) not in error.message:
        line += f" (at {cell(allowed_at)})"
    age = error.problem.get("last_send_age")
    if isinstance(age, int | float) and not isinstance(age, bool):
        line += f"; the last send was {age:.0f} s ago"
    return f"{error.message}\n{line}"


def _resolve_usage_problem(args: argparse.Namespace) -> str | None:
    """Why these resolve options make no sense, or are a slip, if they are.

    The guard rails of the console: a note always; `--applied` says what retries get
    (`--status`, with a body or `--empty-body`) or says there is none (`--no-receipt`);
    `--force` is confirmed (`--yes` without a terminal).
    """
    if args.note is None or not args.note.strip():
        return "--note is required: say what you checked (it is kept in the history)"
    response_options = args.status is not None or args.body is not None or args.header
    if args.not_applied and (response_options or args.empty_body):
        return "--status, --body and --header go with --applied, not --not-applied"
    if args.no_receipt and (not args.applied or response_options or args.empty_body):
        return "--no-receipt goes with --applied alone: no --status, --body or --header"
    if args.applied and args.status is None and not args.no_receipt:
        return (
            "--applied needs the response retries should get: --status N with --body TEXT "
            "(or --empty-body), or --no-receipt to complete it without one (retries then "
            "get 409 receipt-not-retained until a receipt is attached)"
        )
    if (problem := receipt_problem(args)) is not None:
        return problem
    if args.force and not args.not_applied:
        return "--force goes with --not-applied"
    if args.yes and not args.force:
        return "--yes confirms --force: without --force there is nothing to confirm"
    if args.force:
        return no_terminal_problem("release with force", args.yes)
    if args.share_with_owner and args.note is None:
        return "--share-with-owner shares the --note: give one"
    return None


def _search_problem(args: argparse.Namespace) -> str | None:
    """An empty TEXT would be every operation's prefix: that is `list`."""
    return None if args.text else "TEXT is empty: it would match every operation (use list)"
