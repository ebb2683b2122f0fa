"""Confirmation of the commands that cannot be taken back: type the key, not y/n.

A key is typed only by someone who read which operation the command acts on;
`y` is typed by habit. Without a terminal there is no one to ask, so such a
command needs `--yes` there (checked before anything is sent).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any, TextIO

from gateway.cli.admin_client import CommandFailed

__all__ = ["confirm_by_key", "no_terminal_problem"]


def confirm_by_key(
    operation: Mapping[str, Any], question: str, nothing_done: str, err: TextIO
) -> None:
    """Ask `question`, then for the operation's key; `CommandFailed` (exit 1) saying
    `nothing_done` unless the key typed is the operation's."""
    err.write(f"{question}\nType the key to confirm: ")
    err.flush()
    # Read on the loop's thread, blocking it on purpose: nothing else runs while the
    # operator types, and Ctrl-C ends the command at once (a reading worker thread would
    # keep the process alive until Enter).
    answer = sys.stdin.readline()
    if answer.rstrip("\r\n") != operation.get("key"):
        raise CommandFailed(
            f"not confirmed (the key typed does not match): {nothing_done}", exit_code=1
        )


def no_terminal_problem(what: str, yes: bool) -> str | None:
    """The usage problem of a command that must be confirmed, run without a terminal.

    >>> no_terminal_problem("redact", yes=True) is None
    True
    """
    if yes or sys.stdin.isatty():
        return None
    return (
        f"refusing to {what} without confirmation: standard input is not a terminal to "
        f"type the key on; pass --yes to {what} without asking"
    )
