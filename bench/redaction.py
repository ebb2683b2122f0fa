"""CPU per request on the miss path: the fingerprint, and recording the request with redaction.

A request whose key is new is fingerprinted (`gateway.engine.fingerprint.fingerprints`,
version 2 and version 1, as `gateway.proxy.view` calls it) and recorded with its
operation (`gateway.engine.recorded_request.http_record`): secret-named values
replaced in every body format redaction can read, and a keyed digest
(`gateway.engine.digests.Digests.body`, partial on the scope) of the body as kept.
This measures, with no HTTP at all and side by side in one run, microseconds per
call of:

- the plain fingerprint alone (the baseline);
- the keyed fingerprint: the plain one, each form then keyed in the caller's scope
  (`gateway.engine.digests.Digests.fingerprint`), what the store keeps;
- the record with no redaction names (`redact=()`): no parsing for redaction, the
  body decoded (or base64) and digested;
- the record with the default names (`DEFAULT_REQUEST_REDACTIONS`), what a route
  gets unless it says otherwise;

for a 200-byte JSON body, an 8 KiB nested JSON body with a few secret-named
members, a 200-byte form with `password=`, an 8 KiB multipart body with a
secret-named field, a 200-byte JSON body sent as `text/plain`, and 8 KiB of
binary as `application/octet-stream` (with names configured: size and digest
only). Every target carries a query (`?expand=items`) without secret names.

Each cell is the median of `--repeats` runs of a bounded number of calls taking
about `--seconds` each (`time.perf_counter_ns`, one thread), so the whole script
takes about 24 * repeats * seconds plus calibration (about 20 s by default,
a second or two with `--quick`).

    python -m bench.redaction
    python -m bench.redaction --quick
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote_plus

from bench.fingerprints import agent_body
from bench.report import Table, machine_info, ratio
from gateway.config.routes import DEFAULT_REQUEST_REDACTIONS
from gateway.engine.digests import Digests
from gateway.engine.fingerprint import fingerprints
from gateway.engine.recorded_request import REDACTED, http_record

__all__ = [
    "BODIES",
    "Body",
    "fingerprint_call",
    "form_body",
    "keyed_fingerprint_call",
    "main",
    "measure",
    "multipart_body",
    "nested_secrets",
    "record_call",
    "recorded_as",
]

METHOD = "POST"
ROUTE = "tickets"
PATH = "/tickets/v1/issues"
QUERY = "expand=items"
LIMIT = 64 << 10
SCOPE = "hmac:bench-scope"
"""`record_request_max`'s default: every body here is recorded, none is too large."""
BOUNDARY = "bench-boundary-7d3f"
MAX_CALLS = 200_000
"""The most calls in one run of a cell, however fast the call."""


@dataclass(frozen=True, slots=True)
class Body:
    """One request body on the miss path."""

    name: str
    content_type: str
    body: bytes


def nested_secrets(size: int) -> bytes:
    """A nested JSON object of `size` bytes with four secret-named members.

    >>> document = json.loads(nested_secrets(8192))
    >>> len(nested_secrets(8192)), document["customer"]["billing"]["clientSecret"]
    (8192, 'cs_live_0000')
    """
    rng = random.Random(size)
    items: list[dict[str, object]] = []
    document: dict[str, object] = {
        "kind": "order",
        "customer": {
            "name": "Ada",
            "api_key": "ak_live_0000",
            "billing": {"country": "FR", "clientSecret": "cs_live_0000"},
        },
        "auth": {"refresh-token": "rt_0000", "scopes": ["orders", "refunds"]},
        "items": items,
        "note": "",
    }
    while len(json.dumps(document).encode()) <= size:
        items.append(
            {
                "sku": f"S-{rng.randrange(10**6):06d}",
                "title": "Toner cartridge " + str(rng.randrange(1, 9)),
                "quantity": rng.randrange(1, 5),
                "price": round(rng.uniform(1, 90), 2),
                "options": {"gift": rng.random() < 0.5, "labels": ["hw", "é"]},
            }
        )
    items.pop()
    items[0]["options"] = {"gift": False, "password": "p4ss"}
    document["note"] = "n" * (size - len(json.dumps(document).encode()))
    return json.dumps(document).encode()


def form_body(size: int) -> bytes:
    """An `application/x-www-form-urlencoded` login of `size` bytes, `password=` in it.

    >>> len(form_body(200)), form_body(200).split(b"&")[1]
    (200, b'password=hunter2')
    """
    head = b"username=alice&password=hunter2&remember=1&note="
    return head + b"x" * (size - len(head))


def multipart_body(size: int) -> bytes:
    """A `multipart/form-data` body of `size` bytes: a title, an `access_token`, a text file.

    >>> body = multipart_body(8192)
    >>> len(body), body.count(b'name="access_token"')
    (8192, 1)
    """
    delimiter = b"--" + BOUNDARY.encode()

    def part(name: str, content: bytes, extra: bytes = b"") -> bytes:
        head = b'Content-Disposition: form-data; name="' + name.encode() + b'"' + extra
        return delimiter + b"\r\n" + head + b"\r\n\r\n" + content + b"\r\n"

    fixed = part("title", b"Printer on floor 3") + part("access_token", b"at_live_0000")
    file_head = b'; filename="log.txt"\r\nContent-Type: text/plain'
    end = delimiter + b"--\r\n"
    empty = len(fixed + part("attachment", b"", file_head) + end)
    text = (b"toner low, paper jam, " * size)[: size - empty]
    return fixed + part("attachment", text, file_head) + end


BODIES = (
    Body("JSON, 200 B", "application/json", agent_body(200)),
    Body("JSON nested, 8 KiB, 4 secrets", "application/json", nested_secrets(8 << 10)),
    Body("form, 200 B, password=", "application/x-www-form-urlencoded", form_body(200)),
    Body(
        "multipart, 8 KiB, access_token",
        f"multipart/form-data; boundary={BOUNDARY}",
        multipart_body(8 << 10),
    ),
    Body("JSON as text/plain, 200 B", "text/plain", agent_body(200)),
    Body(
        "binary, 8 KiB, octet-stream",
        "application/octet-stream",
        random.Random(0).randbytes(8 << 10),
    ),
)


def fingerprint_call(body: Body) -> Callable[[], object]:
    """The fingerprint as `gateway.proxy.view` computes it for a new key."""
    return functools.partial(
        fingerprints, METHOD, ROUTE, PATH, QUERY, body.content_type, body.body, True
    )


def keyed_fingerprint_call(body: Body) -> Callable[[], object]:
    """The fingerprint as `gateway.proxy.view` stores it: both plain forms, each keyed
    in the caller's scope (`Digests.fingerprint`; the scope's key is cached, as for
    a caller that sends more than one request)."""
    digests = Digests(b"k" * 32)
    plain = fingerprint_call(body)

    def keyed() -> tuple[str, str]:
        current, legacy = plain()  # type: ignore[misc]
        return digests.fingerprint(SCOPE, current), digests.fingerprint(SCOPE, legacy)

    return keyed


def record_call(body: Body, redact: Sequence[str]) -> Callable[[], dict[str, Any] | None]:
    """The record as `gateway.proxy.view` builds it, with `redact` as the route's names."""
    digests = Digests(b"k" * 32)
    return functools.partial(
        http_record,
        method=METHOD,
        target=f"{PATH}?{QUERY}",
        content_type=body.content_type,
        body=body.body,
        limit=LIMIT,
        redact=tuple(redact),
        digest=functools.partial(digests.body, SCOPE),
    )


def recorded_as(record: dict[str, Any] | None) -> str:
    """How a record kept the body: its encoding or why it is gone, and how many values
    were replaced (a form writes the marker URL-encoded).

    >>> recorded_as({"body": '{"a":"[redacted]"}', "body_encoding": "utf-8"})
    'utf-8, 1 redacted'
    >>> recorded_as({"body": "password=%5Bredacted%5D", "body_encoding": "utf-8"})
    'utf-8, 1 redacted'
    >>> recorded_as({"body": None, "body_gone": "unparsed"})
    'size+digest (unparsed)'
    """
    if record is None:
        return "none"
    if record["body"] is None:
        return f"size+digest ({record['body_gone']})"
    text = record["body"]
    replaced = text.count(REDACTED) + text.count(quote_plus(REDACTED))
    return f"{record['body_encoding']}, {replaced} redacted"


def measure(call: Callable[[], object], *, seconds: float, repeats: int) -> float:
    """Microseconds per call: the median of `repeats` runs of about `seconds` each
    (at most `MAX_CALLS` calls a run)."""
    budget = int(seconds * 1e9)
    calls = 1
    while True:  # calibrate (and warm up): enough calls for a tenth of the budget
        started = time.perf_counter_ns()
        for _ in range(calls):
            call()
        spent = max(1, time.perf_counter_ns() - started)
        if spent >= budget // 10 or calls >= MAX_CALLS:
            break
        calls = min(MAX_CALLS, calls * 4)
    calls = max(1, min(MAX_CALLS, calls * budget // spent))
    runs = []
    for _ in range(repeats):
        started = time.perf_counter_ns()
        for _ in range(calls):
            call()
        runs.append((time.perf_counter_ns() - started) / calls)
    return statistics.median(runs) / 1e3


def main(argv: Sequence[str] | None = None) -> int:
    """Print the machine, the Markdown table and what it leaves out."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.redaction",
        description="CPU per request on the miss path: fingerprint, record, redaction.",
    )
    parser.add_argument("--repeats", type=int, default=7, help="runs per cell (default 7)")
    parser.add_argument(
        "--seconds", type=float, default=0.15, help="seconds per run (default 0.15)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="3 runs of 0.02 s per cell (about 2 s in all)"
    )
    args = parser.parse_args(argv)
    repeats, seconds = (3, 0.02) if args.quick else (args.repeats, args.seconds)
    started = time.monotonic()
    print("\n".join(machine_info()))
    print(
        f"- {repeats} runs of about {seconds} s per cell, median; µs per call "
        "(time.perf_counter_ns, one thread, no I/O)\n"
    )
    rows = []
    for body in BODIES:
        plain = record_call(body, ())
        redacted = record_call(body, DEFAULT_REQUEST_REDACTIONS)
        kept = f"{recorded_as(plain())} / {recorded_as(redacted())}"
        fingerprint = measure(fingerprint_call(body), seconds=seconds, repeats=repeats)
        keyed = measure(keyed_fingerprint_call(body), seconds=seconds, repeats=repeats)
        unredacted = measure(plain, seconds=seconds, repeats=repeats)
        default = measure(redacted, seconds=seconds, repeats=repeats)
        rows.append(
            (
                body.name,
                f"{len(body.body):,}",
                kept,
                f"{fingerprint:.2f}",
                f"{keyed:.2f}",
                ratio(keyed, fingerprint),
                f"{unredacted:.2f}",
                f"{default:.2f}",
                ratio(unredacted, fingerprint),
                ratio(default, fingerprint),
                ratio(default, unredacted),
            )
        )
    header = (
        "body",
        "bytes",
        "recorded as (no names / default names)",
        "plain fingerprint µs",
        "keyed fingerprint µs",
        "keyed / plain",
        "record, no names µs",
        "record, default names µs",
        "no names / fingerprint",
        "default names / fingerprint",
        "default / no names",
    )
    print(Table(header, tuple(rows)).render())
    print(
        "\nThe plain fingerprint is versions 2 and 1 together, as the proxy computes them "
        "for a new key; the keyed one adds an HMAC of each in the caller's scope (what is "
        "stored), with the scope's key cached: a scope not in the cache costs one more "
        "HMAC. The record columns include the keyed digest of the body as kept; ratios "
        "against the fingerprint are against the plain one."
    )
    print(f"\nWhole run: {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
