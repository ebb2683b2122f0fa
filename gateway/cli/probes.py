"""`idempotency-gateway probes ...`: what a route's probe can see, through the admin API.

A probe's "not found" releases a key only for request kinds it is declared
for (`applies_to`) and calibrated to see. These commands show the
calibration, run it now for every kind, and re-enable a blind probe for one
kind, with a note (an override for 24 hours if the calibration still fails):

    idempotency-gateway probes show tickets
    idempotency-gateway probes check tickets
    idempotency-gateway probes trust tickets --kind 'POST /*/issues' --note "index rebuilt"

Exit codes as for `operations`: 0 on success; 1 when the gateway answered with an
error; 2 on a usage or configuration error, or when the gateway cannot be reached;
`check` exits 3 when a declared kind is blind.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from typing import Any, TextIO
from urllib.parse import quote

from gateway.cli.admin_client import AdminClient, CommandFailed, cell
from gateway.cli.operations import common_options

__all__ = ["EXIT_BLIND", "register", "table"]

EXIT_BLIND = 3
"""`probes check` found a declared kind the probe cannot see."""


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `probes` command group: `show`, `check` and `trust`."""
    common = common_options()
    group = commands.add_parser(
        "probes", help="show, check and trust what a route's probe can see (admin API)"
    )
    verbs = group.add_subparsers(dest="probes_command", required=True)

    show = verbs.add_parser(
        "show", parents=[common], help="a route's applies_to and every kind's calibration"
    )
    show.add_argument("route", metavar="ROUTE", help="the route's name")
    show.add_argument("--json", action="store_true", help="print the JSON answer")
    show.set_defaults(operations_handler=_show, operations_parser=show)

    check = verbs.add_parser(
        "check",
        parents=[common],
        help="calibrate the probe for every kind of the route's requests now; print a table",
        description="Ask the route's probe, for every kind of request the route has seen, "
        "about the latest operation of that kind the upstream completed (it must be found) "
        "and about a key never used (it must not be). Prints kind / verdict / operation "
        "used; exits 3 when a kind its applies_to covers is blind.",
    )
    check.add_argument("route", metavar="ROUTE", help="the route's name")
    check.add_argument("--json", action="store_true", help="print the JSON answer")
    check.set_defaults(operations_handler=_check, operations_parser=check)

    trust = verbs.add_parser(
        "trust",
        parents=[common],
        help="re-enable a blind probe for one kind (calibration runs again; if it still "
        "fails, an override for 24 hours)",
    )
    trust.add_argument("route", metavar="ROUTE", help="the route's name")
    trust.add_argument("--kind", required=True, help="the kind, as `probes show` prints it")
    trust.add_argument(
        "--note", required=True, help="why the probe can be trusted: kept in the row's history"
    )
    trust.add_argument("--json", action="store_true", help="print the JSON answer")
    trust.set_defaults(operations_handler=_trust, operations_parser=trust)


def _path(route: str, verb: str = "") -> str:
    return f"/admin/probes/{quote(route, safe='')}{verb}"


async def _show(client: AdminClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    document = await client.get(_path(args.route))
    if args.json:
        out.write(json.dumps(document, indent=2) + "\n")
        return
    applies = ", ".join(document.get("applies_to") or []) or "(nothing: never releases)"
    out.write(f"route {cell(document.get('route'))}: the probe applies to {applies}\n")
    rows = [
        {
            "kind": item.get("kind"),
            "verdict": item.get("state"),
            "operation": item.get("sample_operation_id"),
            "detail": _detail(item),
        }
        for item in document.get("kinds") or []
    ]
    out.write(table(rows) if rows else "no kind calibrated yet\n")


async def _check(client: AdminClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    document = await client.post(_path(args.route, "/check"))
    results = document.get("results") or []
    if args.json:
        out.write(json.dumps(document, indent=2) + "\n")
    else:
        out.write(table(results) if results else "the route has no request kinds yet\n")
    if any(row.get("verdict") == "blind" for row in results):
        raise CommandFailed(
            'a kind the probe is declared for is blind: its "not found" releases nothing of '
            "it (see `probes trust`)",
            exit_code=EXIT_BLIND,
        )


async def _trust(client: AdminClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    document = await client.post(
        _path(args.route, "/trust"), {"kind": args.kind, "note": args.note}
    )
    if args.json:
        out.write(json.dumps(document, indent=2) + "\n")
        return
    until = document.get("trusted_until")
    state = cell(document.get("state"))
    line = f"{cell(document.get('kind'))}: {state}"
    if until:
        line += f" until {until} (the calibration still fails: {cell(document.get('detail'))})"
    out.write(line + "\n")


def _detail(item: Mapping[str, Any]) -> str:
    until = item.get("trusted_until")
    return f"until {until}: {item.get('detail')}" if until else str(item.get("detail") or "")


def table(rows: Sequence[Mapping[str, Any]]) -> str:
    """Rows as `KIND  VERDICT  OPERATION  DETAIL` columns.

    >>> print(table([{"kind": "POST /*/issues", "verdict": "calibrated", "operation": "op_1",
    ...               "detail": "found"}]), end="")
    KIND            VERDICT     OPERATION  DETAIL
    POST /*/issues  calibrated  op_1       found
    """
    columns = ("kind", "verdict", "operation", "detail")
    lines = [[name.upper() for name in columns]]
    lines += [[cell(row.get(name)) for name in columns] for row in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(columns) - 1)]
    text = []
    for line in lines:
        head = "  ".join(part.ljust(width) for part, width in zip(line, widths, strict=False))
        text.append(f"{head}  {line[-1]}".rstrip() + "\n")
    return "".join(text)
