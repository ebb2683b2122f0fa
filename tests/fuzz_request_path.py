"""A bounded fuzz loop for the gateway's request path (`make fuzz`).

    python tests/fuzz_request_path.py --seconds 60 [--engine auto|atheris|hypothesis] [--seed N]

Each input (bytes) is decoded into one complete HTTP/1.1 request: a
well-formed protected request with a fresh key, or a request with one fuzzed
part (key headers, path, whole target, method, extra headers, body size, an
`/operations/...` call). It goes over a raw socket to an in-process gateway in
front of a counting upstream, and these invariants are checked after it:

- the gateway never answers 5xx and /healthz stays 200;
- a refused request (4xx, or a hang-up by the HTTP parser) left no upstream
  effect and no operation record;
- a well-formed request with a fresh key got exactly one effect and one
  completed record; any other 2xx/3xx caused at most one effect, and a new
  record only together with that effect.

The engine is atheris (coverage-guided libFuzzer over the instrumented
`gateway` package) when it is installed, else hypothesis; both read the same
decoder. atheris ends the process when the time is up (libFuzzer exits
instead of returning), a failing input is saved under the system temp dir.
Requests never carry a query string (the counting upstream is scripted by
one) nor `Content-Encoding`, which the upstream decodes itself: a 5xx of its
own would then read as the gateway's.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import logging
import os
import shutil
import string
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

if TYPE_CHECKING:
    from harness import RunningGateway
    from upstream import CountingUpstream

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
MAX_BODY = 2048
MAX_INPUT = 1024
PROTECTED = frozenset({"POST", "PATCH"})
TOKEN = string.ascii_letters + string.digits + "-_"
METHODS = ("POST", "PATCH", "GET", "PUT", "DELETE", "HEAD", "OPTIONS")
NOT_FUZZED_HEADERS = frozenset(
    {"content-length", "transfer-encoding", "connection", "expect", "content-encoding"}
)
"""Framing stays ours so every request is complete; `content-encoding`: see the module doc."""

_T = TypeVar("_T")


class ByteReader:
    """Decisions read off the fuzzer's bytes; zeros once they run out."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._position = 0

    def byte(self) -> int:
        if self._position >= len(self._data):
            return 0
        self._position += 1
        return self._data[self._position - 1]

    def below(self, bound: int) -> int:
        return (self.byte() << 8 | self.byte()) % bound

    def choice(self, options: Sequence[_T]) -> _T:
        return options[self.below(len(options))]

    def take(self, most: int) -> bytes:
        size = self.below(most + 1)
        chunk = self._data[self._position : self._position + size]
        self._position += len(chunk)
        return chunk

    def token(self, least: int, most: int) -> str:
        return "".join(self.choice(TOKEN) for _ in range(least + self.below(most - least + 1)))


@dataclass(frozen=True)
class Case:
    """One decoded request; `key` is set when it is well-formed with a fresh key."""

    kind: str
    method: str
    data: bytes
    key: str | None = None
    refused: bool = False
    """The gateway must answer 400 and do nothing (a shape it refuses by rule)."""


DOT_SPELLINGS = (b"..;", b"%2e%2e;", b".%2e;", b"..%3b", b"%2e%2e%3B", b"%2E;a=1", b".;")
"""`..;` and `.;` in the spellings Tomcat, Jetty and Spring read as dot segments."""

METHOD_OVERRIDES = (b"X-HTTP-Method-Override", b"X-Method-Override", b"X-HTTP-Method")

CREDENTIAL_SHAPES = (
    "s3cr€T".encode(),  # UTF-8 outside latin-1
    "s3cr™T".encode(),
    b"\xff\xfe",  # not UTF-8 at all
    b"\xc3\x28",  # an invalid UTF-8 sequence
    "tok-é".encode("latin-1"),  # latin-1, not UTF-8
)


def _line_safe(raw: bytes) -> bytes:
    """Keep fuzzed bytes inside one line and out of the query string."""
    return raw.replace(b"\n", b"").replace(b"?", b"%3F")


def _message(
    method: bytes, target: bytes, headers: list[tuple[bytes, bytes]], body: bytes
) -> bytes:
    lines = [method + b" " + target + b" HTTP/1.1", b"Host: gateway.test", b"Connection: close"]
    lines += [name + b": " + value for name, value in headers]
    lines.append(b"Content-Length: %d" % len(body))
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def decode(data: bytes, serial: int) -> Case:
    """Turn fuzzer bytes into one complete request (`serial` makes fresh keys fresh)."""
    reader = ByteReader(data)
    kind = reader.choice(
        (
            "well-formed",
            "key",
            "path",
            "target",
            "method",
            "headers",
            "body",
            "operations",
            "dots",
            "override",
            "credential",
        )
    )
    fresh = f"fz{serial}-{reader.token(1, 12)}".encode()
    key_header = (b"Idempotency-Key", fresh)
    json = (b"Content-Type", b"application/json")
    issues = b"/tickets/v1/issues"
    if kind == "well-formed":
        method = reader.choice(sorted(PROTECTED))
        target = b"/tickets/v1/" + reader.token(1, 16).encode()
        body = reader.take(MAX_BODY)
        message = _message(method.encode(), target, [key_header, json], body)
        return Case(kind, method, message, key=fresh.decode())
    if kind == "key":
        values = [_line_safe(reader.take(300)) for _ in range(1 + reader.below(3))]
        headers = [(b"Idempotency-Key", value) for value in values]
        return Case(kind, "POST", _message(b"POST", issues, [*headers, json], b"{}"))
    if kind == "path":
        method = reader.choice(METHODS)
        target = b"/tickets/" + _line_safe(reader.take(200))
        return Case(kind, method, _message(method.encode(), target, [key_header, json], b"{}"))
    if kind == "target":
        method = reader.choice(METHODS)
        target = _line_safe(reader.take(200))
        return Case(kind, method, _message(method.encode(), target, [key_header, json], b"{}"))
    if kind == "method":
        raw_method = _line_safe(reader.take(20))
        method = raw_method.decode("latin-1")
        return Case(kind, method, _message(raw_method, issues, [key_header, json], b"{}"))
    if kind == "headers":
        headers = [key_header, json]
        for _ in range(reader.below(9)):
            name = _line_safe(reader.take(40)).replace(b"\r", b"")
            if name.strip().lower().decode("latin-1") in NOT_FUZZED_HEADERS:
                continue
            headers.append((name, _line_safe(reader.take(200))))
        return Case(kind, "POST", _message(b"POST", issues, headers, b"{}"))
    if kind == "dots":  # a dot segment hidden by encoding or `;` parameters
        target = (
            b"/tickets/"
            + _line_safe(reader.take(20)).replace(b"/", b"")
            + b"/"
            + reader.choice(DOT_SPELLINGS)
            + b"/"
            + _line_safe(reader.take(20)).replace(b"/", b"")
        )
        method = reader.choice(METHODS)
        message = _message(method.encode(), target, [key_header, json], b"{}")
        return Case(kind, method, message, refused=True)
    if kind == "override":  # a method the gateway would not see
        method = reader.choice(METHODS)
        override = (reader.choice(METHOD_OVERRIDES), reader.choice(METHODS).encode())
        message = _message(method.encode(), issues, [key_header, json, override], b"{}")
        return Case(kind, method, message, refused=True)
    if kind == "credential":  # scope material outside latin-1 or UTF-8
        credential = b"Bearer " + reader.choice(CREDENTIAL_SHAPES) + _line_safe(reader.take(20))
        headers = [key_header, json, (b"Authorization", credential.replace(b"\r", b""))]
        return Case(kind, "POST", _message(b"POST", issues, headers, b"{}"))
    if kind == "body":
        body = b"x" * reader.below(3 * MAX_BODY)
        return Case(kind, "POST", _message(b"POST", issues, [key_header, json], body))
    segment = _line_safe(reader.take(300)).replace(b" ", b"%20")
    if reader.below(2):
        return Case(kind, "GET", _message(b"GET", b"/operations/" + segment, [], b""))
    target = b"/operations/" + segment + b"/resolve"
    return Case(kind, "POST", _message(b"POST", target, [json], reader.take(300)))


class FuzzTarget:
    """A counting upstream and a gateway on loopback, run by an event loop in its own thread.

    `check(data)` is synchronous, as fuzz engines call it; it raises
    AssertionError when an invariant breaks.
    """

    def __init__(self, workdir: Path, *, read_timeout: float = 5.0) -> None:
        self.workdir = workdir
        self.read_timeout = read_timeout
        self.outcomes: Counter[str] = Counter()
        self._serial = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fuzz-loop")
        self._upstream: CountingUpstream | None = None
        self._gateway: RunningGateway | None = None

    def __enter__(self) -> FuzzTarget:
        self._thread.start()
        try:
            self._run(self._start())
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            self._run(self._stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(30)
            self._loop.close()

    @property
    def total(self) -> int:
        return sum(self.outcomes.values())

    def check(self, data: bytes) -> None:
        self._serial += 1
        self._run(self._check(decode(data, self._serial)))

    def _run(self, coroutine: Coroutine[Any, Any, _T]) -> _T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(60)

    async def _start(self) -> None:
        from harness import settings_for, start_gateway
        from upstream import CountingUpstream

        self._upstream = CountingUpstream()
        await self._upstream.start()
        settings = settings_for(
            self.workdir,
            self._upstream.url,
            route={"max_body": f"{MAX_BODY}B"},
            server={"client_timeout": "1s"},
        )
        self._gateway = await start_gateway(settings)

    async def _stop(self) -> None:
        from harness import stop_gateway

        if self._gateway is not None:
            await stop_gateway(self._gateway)
        if self._upstream is not None:
            await self._upstream.stop()

    async def _check(self, case: Case) -> None:
        from hostile import assert_healthy, record_count
        from rawhttp import address_of, exchange, request

        gateway, upstream = self._gateway, self._upstream
        assert gateway is not None
        assert upstream is not None
        effects, records = upstream.count, await record_count(gateway)
        response = await exchange(address_of(gateway.url), case.data, seconds=self.read_timeout)
        await assert_healthy(gateway)
        new_effects = upstream.count - effects
        new_records = await record_count(gateway) - records
        status = response.status
        seen = f"{case.kind} {case.data[:300]!r} -> {status} {response.body[:300]!r}"
        assert status is None or status < 500, f"5xx: {seen}"
        if case.refused:
            assert status in (None, 400), f"a shape refused by rule was not: {seen}"
        if case.key is not None:
            assert status in (200, 201), f"well-formed request refused: {seen}"
            assert (new_effects, new_records) == (1, 1), (new_effects, new_records, seen)
            lookup_request = request("GET", f"/operations/{case.key}")
            lookup = await exchange(address_of(gateway.url), lookup_request)
            assert lookup.header("idempotency-status") == "completed", seen
            assert upstream.effects[-1].key == json.loads(lookup.body)["id"], seen
            self.outcomes["well-formed"] += 1
        elif status is None or status >= 400:
            assert (new_effects, new_records) == (0, 0), (new_effects, new_records, seen)
            self.outcomes["refused" if status else "hung up"] += 1
        else:
            assert new_effects <= 1, (new_effects, seen)
            assert new_records in (0, new_effects), (new_effects, new_records, seen)
            assert new_records == 0 or case.method in PROTECTED, seen
            self.outcomes["forwarded" if new_effects else "answered"] += 1


def run_hypothesis(target: FuzzTarget, seconds: float, seed: int) -> None:
    """Batches of 50 examples, each batch seeded, until the time is up."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as seeded
    from hypothesis import strategies as st

    deadline = time.monotonic() + seconds
    batch = 0
    while time.monotonic() < deadline:

        @seeded(seed + batch)
        @settings(
            max_examples=50,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(st.binary(max_size=MAX_INPUT))
        def one(data: bytes) -> None:
            target.check(data)

        one()
        batch += 1


def run_atheris(target: FuzzTarget, seconds: float, seed: int | None, workdir: Path) -> NoReturn:
    """libFuzzer until the time is up; it never returns, so the summary is printed here."""
    import atheris

    deadline = time.monotonic() + seconds
    artifacts = Path(tempfile.gettempdir()) / "gateway-fuzz-artifacts"
    artifacts.mkdir(exist_ok=True)

    def one(data: bytes) -> None:
        if time.monotonic() >= deadline:
            finish(target, "atheris", seconds, workdir)
        target.check(data)

    options = [
        f"-max_total_time={int(seconds) + 60}",  # a backstop: `one` ends the run on time
        f"-max_len={MAX_INPUT}",
        "-timeout=60",
        f"-artifact_prefix={artifacts}{os.sep}",
    ]
    if seed is not None:
        options.append(f"-seed={seed}")
    atheris.Setup([sys.argv[0], *options], one)
    atheris.Fuzz()
    raise AssertionError("atheris.Fuzz returned")  # libFuzzer exits; never reached


def finish(target: FuzzTarget, engine: str, seconds: float, workdir: Path) -> NoReturn:
    target.__exit__()
    shutil.rmtree(workdir, ignore_errors=True)
    summary(target, engine, seconds)
    sys.stdout.flush()
    os._exit(0)


def summary(target: FuzzTarget, engine: str, seconds: float) -> None:
    parts = ", ".join(f"{name} {count}" for name, count in sorted(target.outcomes.items()))
    print(f"fuzz ({engine}, {seconds:g}s): {target.total} requests, invariants held: {parts}")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to fuzz")
    parser.add_argument(
        "--engine",
        choices=("auto", "atheris", "hypothesis"),
        default="auto",
        help="auto: atheris when installed, else hypothesis",
    )
    parser.add_argument("--seed", type=int, default=None, help="fix the engine's randomness")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Fuzz for `--seconds`; 0 when every invariant held, 1 on the first violation."""
    args = parse_args(argv)
    for path in (str(ROOT), str(TESTS)):
        if path not in sys.path:
            sys.path.insert(0, path)
    engine = args.engine
    if engine == "auto":
        engine = "atheris" if importlib.util.find_spec("atheris") else "hypothesis"
    if engine == "atheris":
        import atheris

        with atheris.instrument_imports(include=["gateway"]):
            import gateway.web.app  # noqa: F401  (imported here to be instrumented)
    workdir = Path(tempfile.mkdtemp(prefix="gateway-fuzz-"))
    print(f"fuzzing the request path with {engine} for {args.seconds:g}s (store in {workdir})")
    with FuzzTarget(workdir) as target:
        if engine == "atheris":
            run_atheris(target, args.seconds, args.seed, workdir)
        seed = int.from_bytes(os.urandom(4), "big") if args.seed is None else args.seed
        print(f"hypothesis seed {seed} (rerun with --seed {seed})")
        try:
            run_hypothesis(target, args.seconds, seed)
        except Exception as failure:
            print(f"fuzz: {type(failure).__name__} after {target.total} requests: {failure}")
            return 1
    shutil.rmtree(workdir, ignore_errors=True)
    summary(target, engine, args.seconds)
    return 0


if __name__ == "__main__":
    # Refusing malformed requests is the point here: aiohttp's traceback for each
    # one would bury the summary and any failure.
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)
    sys.exit(main())
