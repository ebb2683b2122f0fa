"""The options that describe a receipt, shared by `resolve --applied` and `attach`.

A receipt is replayed to every retry of its key for as long as it is kept, so
the options say it whole or refuse: a status with a body, or a body said to
be empty (`--empty-body`), never an empty one by default.
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_receipt_arguments", "receipt_document", "receipt_problem"]


def add_receipt_arguments(parser: argparse.ArgumentParser, *, when: str) -> None:
    """`--status`, `--body`, `--empty-body` and `--header`; `when` says what they go with."""
    parser.add_argument("--status", type=_status, help=f"{when}the response status replays get")
    parser.add_argument("--body", help=f"{when}the response body (UTF-8)")
    parser.add_argument(
        "--empty-body",
        action="store_true",
        help=f"{when}the tool's answer really had no body (without it, an empty --body is "
        "refused: every retry would get that empty answer)",
    )
    parser.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="'NAME: VALUE'",
        help=f"{when}a response header; repeatable",
    )


def receipt_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the receipt options given with a `--status`, if anything."""
    if args.status is None and (args.body is not None or args.header or args.empty_body):
        return "--body, --empty-body and --header describe a response: give its --status too"
    for header in args.header:
        name, colon, _ = header.partition(":")
        if not colon or not name.strip() or name != name.strip():
            return f"--header {header!r}: expected 'Name: value'"
    if args.empty_body and args.body:
        return "--empty-body says the answer had no body: not with --body"
    if args.status is not None and not args.body and not args.empty_body:
        return (
            "--status with no --body stores an empty answer for every retry: give "
            "--body TEXT, or --empty-body if the tool's answer really had none"
        )
    return None


def receipt_document(args: argparse.Namespace) -> dict[str, Any]:
    """The `response` member of a resolve or attach body."""
    return {
        "status": args.status,
        "headers": _headers(args.header),
        "body": args.body or "",
        "body_encoding": "utf-8",
    }


def _headers(options: list[str]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for option in options:
        name, _, value = option.partition(":")
        lower, value = name.lower(), value.strip()
        headers[lower] = f"{headers[lower]}, {value}" if lower in headers else value
    return headers


def _status(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an HTTP status, got {text!r}") from None
    if not 100 <= value <= 599:
        raise argparse.ArgumentTypeError(f"expected an HTTP status (100-599), got {text!r}")
    return value
