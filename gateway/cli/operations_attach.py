"""`operations attach`: the receipt an `applied` settlement went without, attached once.

`resolve --applied --no-receipt` (or an owner's `applied` without a response)
completes a key whose retries get `409 receipt-not-retained`: the agent learns
the effect happened, not its result. When the result is found later, this
attaches it, once, recorded in the history; every retry is answered with it
from then on. A settlement is otherwise final.
"""

from __future__ import annotations

import argparse
import json
from typing import Any, TextIO

from gateway.cli.admin_client import AdminClient, add_reference, find_operation, operation_path
from gateway.cli.receipt_options import add_receipt_arguments, receipt_document, receipt_problem

__all__ = ["register"]


def register(
    verbs: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    attach = verbs.add_parser(
        "attach",
        parents=[common],
        help="attach the receipt an applied settlement went without (once)",
        description="For an operation settled applied without a receipt (its retries get "
        "409 receipt-not-retained): store the response retries get from now on. Once; the "
        "history records it.",
    )
    add_reference(attach)
    add_receipt_arguments(attach, when="")
    attach.add_argument(
        "--note", help="where the response comes from (required): kept in the history"
    )
    attach.add_argument(
        "--share-with-owner",
        action="store_true",
        help="the key's owner sees the note in GET /operations/<key>",
    )
    attach.set_defaults(
        operations_handler=_attach, operations_parser=attach, operations_usage=_attach_problem
    )


async def _attach(client: AdminClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    operation = await find_operation(client, args.id, args.scope)
    body: dict[str, Any] = {"response": receipt_document(args), "note": args.note}
    if args.share_with_owner:
        body["share_with_owner"] = True
    document = await client.post(f"{operation_path(operation)}/receipt", body)
    out.write(json.dumps(document, indent=2) + "\n")


def _attach_problem(args: argparse.Namespace) -> str | None:
    if args.note is None or not args.note.strip():
        return "--note is required: say where the response comes from (it is kept in the history)"
    if args.status is None:
        return "--status N is the receipt: give it, with --body TEXT (or --empty-body)"
    return receipt_problem(args)
