"""CPU per request fingerprint: version 1 (bytes as received) against version 2 (meaning).

Version 2 parses a JSON body and writes its RFC 8785 canonical form before
hashing (`gateway.engine.fingerprint.canonical_json`); version 1 hashes the
bytes. Both run once for every new key, on the event loop, so this measures
what that costs, with no HTTP at all: CPU microseconds per fingerprint
(`time.process_time`) for the 200-byte JSON object a benchmark agent sends,
a 1 KiB and a 64 KiB JSON object, and a 200-byte `application/octet-stream`
body (version 2 hashes it as bytes too: it only adds the path and query
normalisation).

Each cell is the best of `--repeats` runs of enough calls to take `--seconds`
of CPU (the minimum is the run least disturbed by the rest of the machine),
so the whole script takes about 8 * repeats * seconds (under 10 s by default).

    python -m bench.fingerprints
    python -m bench.fingerprints --repeats 9 --seconds 0.5
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bench.report import Table, ratio
from gateway.engine.fingerprint import fingerprint_request, legacy_fingerprint_request

__all__ = ["BODIES", "Body", "agent_body", "main", "measure", "padded_object"]


@dataclass(frozen=True, slots=True)
class Body:
    """One request body to fingerprint."""

    name: str
    content_type: str
    body: bytes


def agent_body(size: int = 200) -> bytes:
    """The ticket a benchmark agent creates, its description padded to `size` bytes.

    >>> len(agent_body()), json.loads(agent_body())["labels"]
    (200, ['a', 'b'])
    """
    ticket: dict[str, object] = {"title": "Printer on floor 3", "body": "", "priority": 3}
    ticket["labels"] = ["a", "b"]
    base = len(json.dumps(ticket).encode())
    ticket["body"] = ("toner low, " * size)[: max(0, size - base)]
    return json.dumps(ticket).encode()


def padded_object(size: int) -> bytes:
    """A JSON object of `size` bytes: ticket-like records under "items", and a padding "note".

    >>> len(padded_object(1024)), len(padded_object(64 * 1024))
    (1024, 65536)
    """
    rng = random.Random(size)
    items: list[dict[str, object]] = []
    document: dict[str, object] = {"kind": "batch", "version": 2, "note": "", "items": items}
    while len(json.dumps(document).encode()) <= size:
        items.append(
            {
                "id": f"T-{rng.randrange(10**6):06d}",
                "title": "Printer on floor " + str(rng.randrange(1, 9)),
                "priority": rng.randrange(1, 5),
                "estimate": round(rng.uniform(0, 40), 2),
                "done": rng.random() < 0.5,
                "labels": rng.sample(["ops", "hw", "urgent", "floor-3", "é"], 2),
            }
        )
    items.pop()
    document["note"] = "n" * (size - len(json.dumps(document).encode()))
    return json.dumps(document).encode()


BODIES = (
    Body("agent JSON, 200 B", "application/json", agent_body(200)),
    Body("JSON, 1 KiB", "application/json", padded_object(1024)),
    Body("JSON, 64 KiB", "application/json", padded_object(64 * 1024)),
    Body("octet-stream, 200 B", "application/octet-stream", random.Random(0).randbytes(200)),
)


def measure(fingerprint: Callable[..., str], body: Body, *, seconds: float, repeats: int) -> float:
    """CPU microseconds per call: the best of `repeats` runs of about `seconds` each."""

    def call() -> None:
        fingerprint(
            method="POST",
            route="tickets",
            path="/tickets/v1/issues",
            query="",
            content_type=body.content_type,
            body=body.body,
        )

    calls = 1
    while True:  # calibrate: enough calls for a tenth of the budget
        started = time.process_time()
        for _ in range(calls):
            call()
        spent = time.process_time() - started
        if spent >= seconds / 10:
            break
        calls *= 4
    calls = max(1, int(calls * seconds / spent))
    best = float("inf")
    for _ in range(repeats):
        started = time.process_time()
        for _ in range(calls):
            call()
        best = min(best, (time.process_time() - started) / calls)
    return best * 1e6


def main(argv: Sequence[str] | None = None) -> int:
    """Print the Markdown table."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.fingerprints",
        description="CPU per request fingerprint, version 1 against version 2.",
    )
    parser.add_argument("--repeats", type=int, default=5, help="runs per cell (default 5)")
    parser.add_argument(
        "--seconds", type=float, default=0.2, help="CPU seconds per run (default 0.2)"
    )
    args = parser.parse_args(argv)
    rows = []
    for body in BODIES:
        v1 = measure(legacy_fingerprint_request, body, seconds=args.seconds, repeats=args.repeats)
        v2 = measure(fingerprint_request, body, seconds=args.seconds, repeats=args.repeats)
        rows.append((body.name, f"{len(body.body):,}", f"{v1:.2f}", f"{v2:.2f}", ratio(v2, v1)))
    header = ("body", "bytes", "v1 (legacy) µs CPU", "v2 µs CPU", "v2/v1")
    print(Table(header, tuple(rows)).render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
