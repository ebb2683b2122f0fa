"""`operations history|verify|probe|redact`: what happened, whether its record holds, asking
the tool again, and erasing personal data.

The console shows an operation's history; an operator on a terminal, or a
script at night, needs the same answers: one line an event to read or grep,
an exit code that says whether any history chain was edited behind the
gateway's back, a probe of a whole route that ends (or says it gave up), and
a redaction that is never one stray Enter away.

    idempotency-gateway operations history run-77:0:c1
    idempotency-gateway operations verify --all              # exit 3: a chain is broken
    idempotency-gateway operations probe --route tickets --timeout 10m
    idempotency-gateway operations redact op_01J... --reason "GDPR request 12"
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Mapping
from typing import Any, TextIO
from urllib.parse import quote

from gateway.cli.admin_client import (
    AdminClient,
    CommandFailed,
    add_reference,
    cell,
    check_new_cursor,
    cursor_param,
    find_operation,
    operation_path,
)
from gateway.cli.confirm import confirm_by_key, no_terminal_problem
from gateway.config.units import parse_duration

__all__ = [
    "EXIT_BROKEN_CHAIN",
    "EXIT_STILL_RUNNING",
    "format_history",
    "register",
]

EXIT_BROKEN_CHAIN = 3
"""`verify` found an event that is not what the gateway wrote (or one missing)."""

EXIT_STILL_RUNNING = 4
"""`probe --route` stopped waiting; the job goes on in the gateway."""

PROBE_JOB_TIMEOUT = 300.0
"""Seconds `probe --route` waits for its job by default."""

HISTORY_PAGE = 200
"""Events asked for a page (the most an operation's JSON embeds)."""

_POLL_FIRST = 0.25
_POLL_MAX = 2.0
"""A short job is reported at once; a long one is asked about every 2 s, no more."""

_EVENT_FRAME = frozenset({"seq", "at", "type", "actor", "version", "note"})
"""What every event line shows in its own column (the note last); the rest are details."""


def register(
    verbs: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    """Add `history`, `verify`, `probe` and `redact` to the `operations` group."""
    _register_history(verbs, common)
    _register_verify(verbs, common)
    _register_probe(verbs, common)
    _register_redact(verbs, common)


def _register_history(
    verbs: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    history = verbs.add_parser(
        "history",
        parents=[common],
        help="print an operation's history, one event a line",
        description="Print an operation's history, oldest first, one event a line: seq, "
        "time, type, actor, the event's details, and the note as it was written (characters "
        "a terminal would act on are shown escaped, e.g. \\n; --json gives them exactly).",
    )
    add_reference(history)
    history.add_argument("--json", action="store_true", help="print the events as JSON")
    history.set_defaults(operations_handler=_history, operations_parser=history)


def _register_verify(
    verbs: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    verify = verbs.add_parser(
        "verify",
        parents=[common],
        help="check that history chains are intact (exit 3 when one is broken)",
        description="Check that an operation's history (or every operation's, with --all) "
        "is the chain of events the gateway wrote. An event whose note, reason or request "
        "was erased on purpose (a redaction, retention) is reported as redacted, not broken.",
        epilog=f"exit codes: 0 every chain is intact; {EXIT_BROKEN_CHAIN} a chain is broken "
        "(the first broken event is named on stderr: operation id, key, seq, reason); "
        "1 the gateway answered with an error; 2 a usage error, or no gateway to ask.",
    )
    add_reference(verify, optional=True)
    verify.add_argument("--all", action="store_true", help="every operation, a page at a time")
    verify.add_argument("--json", action="store_true", help="print the gateway's report as JSON")
    verify.set_defaults(
        operations_handler=_verify, operations_parser=verify, operations_usage=_verify_problem
    )


def _register_probe(
    verbs: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    probe = verbs.add_parser(
        "probe",
        parents=[common],
        help="ask the tool now whether unknown operations took effect",
        description="Probe one unknown operation now and print its state, or (--route) "
        "every unknown operation of a route, waiting for the gateway's job to finish.",
        epilog=f"exit codes: 0 probed; 1 the gateway refused (not unknown, no probe); "
        f"{EXIT_STILL_RUNNING} --timeout passed before the route's job finished (it goes on "
        "in the gateway: run the command again to follow it); 2 a usage error, or no gateway.",
    )
    add_reference(probe, optional=True)
    probe.add_argument("--route", help="probe every unknown operation of this route")
    probe.add_argument(
        "--timeout",
        type=_duration,
        default=PROBE_JOB_TIMEOUT,
        help="with --route: how long to wait for the job (300s, 10m; default 300s)",
    )
    probe.add_argument("--json", action="store_true", help="print the gateway's answer as JSON")
    probe.set_defaults(
        operations_handler=_probe, operations_parser=probe, operations_usage=_probe_problem
    )


def _register_redact(
    verbs: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    redact = verbs.add_parser(
        "redact",
        parents=[common],
        help="erase an operation's recorded request and receipt (personal data)",
        description="Erase the recorded request body and the receipt's headers and body, in "
        "any state; the key stays used (a retry of a completed one gets receipt-not-retained). "
        "Asks you to type the key unless --yes; without a terminal, --yes is required.",
        epilog="exit codes: 0 redacted; 1 the gateway refused, or the key typed did not "
        "match (nothing was erased); 2 a usage error, or no gateway.",
    )
    add_reference(redact)
    redact.add_argument("--reason", required=True, help="why: kept in the operation's history")
    redact.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    redact.set_defaults(
        operations_handler=_redact, operations_parser=redact, operations_usage=_redact_problem
    )


# history


async def _history(client: AdminClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    operation = await find_operation(client, args.id, args.scope)
    events = await read_history(client, operation)
    if args.json:
        out.write(json.dumps(events, indent=2) + "\n")
    else:
        out.write(format_history(events))


async def read_history(
    client: AdminClient, operation: Mapping[str, Any]
) -> list[Mapping[str, Any]]:
    """Every event, page after page: each page asks for the events after the last seq read.

    The page's `next` says only whether more follow; asking after the last seq
    read means no event is skipped or printed twice, whichever seq `next` is.
    """
    path = f"{operation_path(operation)}/history"
    events: list[Mapping[str, Any]] = []
    while True:
        params = {"limit": str(HISTORY_PAGE)}
        if events:
            params["after"] = str(events[-1]["seq"])
        items, more = _history_page(await client.get(path, params))
        if events and items and items[0]["seq"] <= events[-1]["seq"]:
            raise CommandFailed(
                f"error: the gateway's history page after seq {events[-1]['seq']} starts at "
                f"seq {items[0]['seq']}",
                exit_code=1,
            )
        events += items
        if not more or not items:
            return events


def _history_page(document: Any) -> tuple[list[Mapping[str, Any]], bool]:
    items = document.get("items") if isinstance(document, dict) else None
    if not isinstance(items, list) or not all(
        isinstance(item, dict) and isinstance(item.get("seq"), int) for item in items
    ):
        raise CommandFailed(
            "error: the gateway's answer has no 'items' list of events", exit_code=1
        )
    return items, document.get("next") is not None


def format_history(events: list[Mapping[str, Any]]) -> str:
    """The events one a line, their first four columns aligned.

    >>> print(format_history([
    ...     {"seq": 1, "type": "claimed", "at": "T1", "actor": "gateway", "version": 1,
    ...      "attempt": 1, "token": 1},
    ...     {"seq": 12, "type": "resolved", "at": "T2", "actor": "admin:ann", "version": 4,
    ...      "attempt": 1, "outcome": "not_applied", "force": False,
    ...      "note": "not in the CRM\\n(asked Bo)"},
    ... ]), end="")
    1   T1  claimed   gateway    attempt=1 token=1
    12  T2  resolved  admin:ann  attempt=1 outcome=not_applied force=false  note: not in the CRM\\n(asked Bo)
    """  # noqa: E501
    rows = [_event_columns(event) for event in events]
    widths = [max((len(row[column]) for row in rows), default=0) for column in range(4)]
    lines = [
        "  ".join(
            [*(text.ljust(width) for text, width in zip(row[:4], widths, strict=True)), *row[4:]]
        ).rstrip()
        for row in rows
    ]
    return "".join(line + "\n" for line in lines)


def _event_columns(event: Mapping[str, Any]) -> list[str]:
    details = " ".join(
        f"{cell(name)}={_value(value)}"
        for name, value in event.items()
        if name not in _EVENT_FRAME and value is not None
    )
    columns = [cell(event.get(name)) for name in ("seq", "at", "type", "actor")]
    columns.append(details)
    note = event.get("note")
    if note is not None:
        # The note as written; only what a terminal would act on is escaped (cell).
        columns.append(f"note: {cell(note)}")
    return columns


def _value(value: Any) -> str:
    """A detail's value: a plain word as it is, anything else as (escaped) JSON.

    >>> _value("timed-out"), _value("no answer in 60s"), _value(False), _value(404)
    ('timed-out', '"no answer in 60s"', 'false', '404')
    """
    if (
        isinstance(value, str)
        and value
        and all(
            char.isprintable() and not char.isspace() and char not in "\"'=\\" for char in value
        )
    ):
        return value
    return cell(json.dumps(value, ensure_ascii=False, separators=(",", ":")))


# verify


async def _verify(client: AdminClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    if args.all:
        await _verify_all(client, args, out)
    else:
        await _verify_one(client, args, out)


async def _verify_one(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    operation = await find_operation(client, args.id, args.scope)
    report = await client.get(f"{operation_path(operation)}/verify")
    if not isinstance(report, dict) or not isinstance(report.get("ok"), bool):
        raise CommandFailed("error: the gateway's verify answer has no 'ok'", exit_code=1)
    report = {"id": operation["id"], "key": operation.get("key"), **report}
    out.write(json.dumps(report, indent=2) + "\n" if args.json else verify_summary(report))
    if not report["ok"]:
        broken = _mapping(report.get("broken"))
        raise CommandFailed(broken_message({**report, **broken}), exit_code=EXIT_BROKEN_CHAIN)


def verify_summary(report: Mapping[str, Any]) -> str:
    """One operation's verification, as a line (two when some events were redacted).

    >>> print(verify_summary({"id": "op_1", "key": "k", "scope": "s", "ok": True,
    ...     "events": 7, "redacted": [5], "broken": None}), end="")
    op_1 key 'k' (scope s): 7 events, chain intact
      redacted (erased on purpose, not broken): seq 5
    """
    head = (
        f"{cell(report.get('id'))} key {_quoted(report.get('key'))} "
        f"(scope {cell(report.get('scope'))})"
    )
    if report.get("ok"):
        lines = [f"{head}: {report.get('events')} events, chain intact"]
    else:
        broken = _mapping(report.get("broken"))
        lines = [f"{head}: chain broken at seq {broken.get('seq')}: {cell(broken.get('reason'))}"]
    redacted = report.get("redacted") or []
    if redacted:
        seqs = ", ".join(cell(seq) for seq in redacted)
        lines.append(f"  redacted (erased on purpose, not broken): seq {seqs}")
    return "".join(line + "\n" for line in lines)


async def _verify_all(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    report = await _verify_pages(client)
    if args.json:
        out.write(json.dumps(report, indent=2) + "\n")
    else:
        out.write(verify_all_summary(report))
    broken: list[Mapping[str, Any]] = report["broken"]
    if broken:
        raise CommandFailed(broken_message(broken[0]), exit_code=EXIT_BROKEN_CHAIN)
    checkpoints = _mapping(report.get("checkpoints"))
    if checkpoints.get("ok") is False:
        reason = cell(_mapping(checkpoints.get("broken")).get("reason"))
        raise CommandFailed(f"checkpoint chain broken: {reason}", exit_code=EXIT_BROKEN_CHAIN)


async def _verify_pages(client: AdminClient) -> dict[str, Any]:
    """Every page of `GET /admin/verify`, added up; the checkpoints come with the first."""
    checked, redacted, broken = 0, 0, []
    cursor: str | None = None
    seen: set[str] = set()
    checkpoints: Any = None
    while True:
        page = await client.get("/admin/verify", cursor_param(cursor))
        if checkpoints is None and isinstance(page, dict):
            checkpoints = page.get("checkpoints")
        page_checked, page_broken, cursor = _verify_page(page)
        checked += page_checked
        redacted += _count(page.get("redacted_events"))
        broken += page_broken
        if cursor is None:
            report = {"checked": checked, "redacted_events": redacted, "broken": broken}
            if isinstance(checkpoints, dict):
                report["checkpoints"] = checkpoints
            return report
        check_new_cursor(cursor, seen)


def verify_all_summary(report: Mapping[str, Any]) -> str:
    """What `verify --all` found: a line, then one a broken chain.

    >>> print(verify_all_summary({"checked": 9, "redacted_events": 2, "broken": []}), end="")
    checked 9 operations: every history chain is intact (2 events redacted on purpose, not broken)
    """
    broken = report["broken"]
    verdict = (
        f"{len(broken)} with a broken history chain"
        if broken
        else ("every history chain is intact")
    )
    line = f"checked {report['checked']} operations: {verdict}"
    if count := report["redacted_events"]:
        line += f" ({count} event{'' if count == 1 else 's'} redacted on purpose, not broken)"
    lines = [line, *(f"  {_broken_fields(item)}" for item in broken)]
    checkpoints = _mapping(report.get("checkpoints"))
    if checkpoints.get("ok") is True and checkpoints.get("count"):
        lines.append(
            f"checkpoints: {checkpoints.get('count')} in an intact chain, the latest at "
            f"{cell(checkpoints.get('latest_at'))} (compare it with the gateway's log)"
        )
    elif checkpoints.get("ok") is False:
        reason = cell(_mapping(checkpoints.get("broken")).get("reason"))
        lines.append(f"checkpoints: chain broken: {reason}")
    return "".join(item + "\n" for item in lines)


def _count(value: Any) -> int:
    """A count the answer may lack (an older gateway): 0 then."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _verify_page(document: Any) -> tuple[int, list[Mapping[str, Any]], str | None]:
    if (
        not isinstance(document, dict)
        or not isinstance(document.get("checked"), int)
        or not isinstance(document.get("broken"), list)
    ):
        raise CommandFailed(
            "error: the gateway's verify page has no 'checked' and 'broken'", exit_code=1
        )
    cursor = document.get("next_cursor")
    broken: list[Mapping[str, Any]] = [
        item for item in document["broken"] if isinstance(item, dict)
    ]
    checked: int = document["checked"]
    return checked, broken, cursor if isinstance(cursor, str) and cursor else None


def _mapping(value: Any) -> Mapping[str, Any]:
    """`value` when it is a JSON object, else an empty one (a field the answer lacks)."""
    return value if isinstance(value, dict) else {}


def broken_message(broken: Mapping[str, Any]) -> str:
    """The first broken event, for stderr: which operation, which key, which seq, why.

    >>> broken_message({"id": "op_1", "key": "k", "scope": "s", "seq": 1, "reason": "edited"})
    "history chain broken: operation op_1, key 'k', scope s, seq 1: edited"
    """
    return f"history chain broken: {_broken_fields(broken)}"


def _broken_fields(broken: Mapping[str, Any]) -> str:
    return (
        f"operation {cell(broken.get('id'))}, key {_quoted(broken.get('key'))}, "
        f"scope {cell(broken.get('scope'))}, seq {cell(broken.get('seq'))}: "
        f"{cell(broken.get('reason'))}"
    )


def _quoted(key: Any) -> str:
    return cell(repr(key)) if isinstance(key, str) else cell(key)


# probe


async def _probe(client: AdminClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    if args.route is not None:
        await _probe_route(client, args, out, err)
        return
    operation = await find_operation(client, args.id, args.scope)
    document = await client.post(f"{operation_path(operation)}/probe")
    if not isinstance(document, dict):
        raise CommandFailed("error: the gateway's probe answer is not an operation", exit_code=1)
    out.write(
        json.dumps(document, indent=2) + "\n" if args.json else probe_summary(operation, document)
    )


def probe_summary(before: Mapping[str, Any], after: Mapping[str, Any]) -> str:
    """The state a probe left, and the verdict it recorded, when the answer shows it.

    >>> print(probe_summary({"id": "op_1", "key": "k", "state": "unknown"},
    ...     {"id": "op_1", "key": "k", "state": "released", "history": [
    ...      {"seq": 4, "type": "probe", "verdict": "not_applied", "status": 404}]}), end="")
    op_1 key 'k': released (was unknown); probe verdict not_applied, status 404
    """
    was, now = before.get("state"), after.get("state")
    state = f"{cell(now)} (was {cell(was)})" if was != now else f"still {cell(now)}"
    line = f"{cell(after.get('id'))} key {_quoted(after.get('key'))}: {state}"
    history = after.get("history")
    events = history if isinstance(history, list) else []
    probes = [event for event in events if isinstance(event, dict) and event.get("type") == "probe"]
    if probes:
        verdict = probes[-1]
        line += f"; probe verdict {cell(verdict.get('verdict'))}"
        if verdict.get("status") is not None:
            line += f", status {cell(verdict['status'])}"
        if verdict.get("detail"):
            line += f" ({cell(verdict['detail'])})"
    return line + "\n"


async def _probe_route(
    client: AdminClient, args: argparse.Namespace, out: TextIO, err: TextIO
) -> None:
    """Start (or join) the route's probe job and wait for it, at most `--timeout`."""
    route: str = args.route
    job = _job(await client.post("/admin/operations/probe", params={"route": route}))
    print(f"probing the unknown operations of route {cell(route)}...", file=err)
    path = f"/admin/probe-jobs/{quote(route, safe='')}"
    deadline = time.monotonic() + args.timeout
    delay = _POLL_FIRST
    while job.get("state") != "done":
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise CommandFailed(
                _still_running(route, job, args.timeout), exit_code=EXIT_STILL_RUNNING
            )
        await asyncio.sleep(min(delay, remaining))
        delay = min(delay * 2, _POLL_MAX)
        job = _job(await client.get(path))
    out.write(json.dumps(job, indent=2) + "\n" if args.json else job_summary(job))


def _job(document: Any) -> Mapping[str, Any]:
    if not isinstance(document, dict) or not isinstance(document.get("state"), str):
        raise CommandFailed("error: the gateway's probe job answer has no 'state'", exit_code=1)
    return document


def job_summary(job: Mapping[str, Any]) -> str:
    """A finished route probe's counts.

    >>> print(job_summary({"route": "tickets", "state": "done", "total": 12, "probed": 12,
    ...     "applied": 5, "not_applied": 4, "still_unknown": 3}), end="")
    route tickets: probed 12 of 12 unknown operations: 5 applied, 4 not applied, 3 still unknown
    """
    counts = ", ".join(
        f"{cell(job.get(name))} {label}"
        for name, label in (
            ("applied", "applied"),
            ("not_applied", "not applied"),
            ("still_unknown", "still unknown"),
        )
    )
    return (
        f"route {cell(job.get('route'))}: probed {cell(job.get('probed'))} of "
        f"{cell(job.get('total'))} unknown operations: {counts}\n"
    )


def _still_running(route: str, job: Mapping[str, Any], timeout: float) -> str:
    return (
        f"gave up waiting after {timeout:g} s: the probe job of route {cell(route)} is still "
        f"running (probed {cell(job.get('probed'))} of {cell(job.get('total'))} so far). It "
        "goes on in the gateway: run this command again to follow it"
    )


# redact


async def _redact(client: AdminClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    operation = await find_operation(client, args.id, args.scope)
    if not args.yes:
        confirm_by_key(operation, confirmation_prompt(operation), "nothing was erased", err)
    document = await client.post(f"{operation_path(operation)}/redact", {"reason": args.reason})
    out.write(json.dumps(document, indent=2) + "\n")


def confirmation_prompt(operation: Mapping[str, Any]) -> str:
    """What a redaction erases of this operation, and the question.

    >>> prompt = confirmation_prompt({"id": "op_1", "key": "k", "scope": "s",
    ...                               "state": "completed"})
    >>> print(prompt.splitlines()[0])
    This erases the recorded request body, and the receipt's headers and body, of op_1 (key 'k', scope s, completed). It cannot be undone.
    """  # noqa: E501
    state = operation.get("state")
    erased = "the recorded request body" + (
        ", and the receipt's headers and body," if state == "completed" else ""
    )
    return (
        f"This erases {erased} of {cell(operation.get('id'))} (key "
        f"{_quoted(operation.get('key'))}, scope {cell(operation.get('scope'))}, "
        f"{cell(state)}). It cannot be undone."
    )


# Usage


def _verify_problem(args: argparse.Namespace) -> str | None:
    if args.all and args.id is not None:
        return "ID_OR_KEY or --all, not both"
    if not args.all and args.id is None:
        return "which operation? give ID_OR_KEY, or --all for every one"
    if args.all and args.scope is not None:
        return "--scope picks a key's operation; --all verifies every operation"
    return None


def _probe_problem(args: argparse.Namespace) -> str | None:
    if args.route is not None and args.id is not None:
        return "ID_OR_KEY or --route, not both"
    if args.route is None and args.id is None:
        return "which operation? give ID_OR_KEY, or --route NAME for every unknown one of a route"
    if args.route is not None and args.scope is not None:
        return "--scope picks a key's operation; --route probes every unknown one of a route"
    return None


def _redact_problem(args: argparse.Namespace) -> str | None:
    if not args.reason.strip():
        return "--reason is kept in the history: give one"
    return no_terminal_problem("redact", args.yes)


def _duration(text: str) -> float:
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive duration, got {text!r}")
    return seconds
