"""The access log: one line a request, formatted cheaply and written off the event loop.

Through `logging`, each line cost a `LogRecord`, its `extra` dict merged into
the record, a formatter walking the record's attributes and a blocking write
to stderr on the event loop: measured, about a third of replay throughput.
Here the event loop only appends the request's facts (a tuple) to a buffer.
A writer thread takes the buffer in batches (every `FLUSH_SECONDS`, or at
`MAX_BATCH` lines), formats each line (one format string filled with the
values, each string escaped as JSON; the text form: one format string too),
mostly while the loop waits on a socket or the store, and writes the batch
with one call, holding the log handler's lock so that no warning or error
line, which `logging` still writes at once, is ever cut into an access line.

Nothing is lost on `SIGTERM`: the gateway drains its requests, then `close`
writes what is buffered and waits for the writer. What a `SIGKILL` loses is
at most the last `FLUSH_SECONDS` of lines.

The line has the fields it had as a `logging` record, in the same order, so
what reads the log needs no change:

    {"ts": "2026-12-02T16:10:00.123Z", "level": "info", "logger": "gateway.access",
     "message": "POST /tickets/v1/issues 201", "event": "request", "request_id": ...,
     "method", "path", "status", "route", "outcome", "error", "state", "key",
     "scope", "operation_id", "upstream_ms", "total_ms"}
"""

from __future__ import annotations

import asyncio
import logging
import queue
import sys
import threading
import time
from collections.abc import Callable
from json.encoder import encode_basestring_ascii as _quote
from typing import TYPE_CHECKING, Literal, TextIO

from gateway.engine.scopes import scope_hash
from gateway.web.logs import escape_controls

if TYPE_CHECKING:
    from gateway.engine.exchange import RequestTrace

LOGGER = "gateway.access"
FLUSH_SECONDS = 0.1
"""A line reaches the log at most this late (and a `SIGKILL` loses at most this much)."""
MAX_BATCH = 512
"""A buffer this long is handed to the writer at once, without waiting for the timer."""

_Facts = tuple[
    float, str, str, int, float, str, str | None, str | None, str | None, str | None,
    str | None, str | None, str | None, float | None,
]  # fmt: skip
"""What a line says, taken on the event loop: the time, method, path, status, elapsed
seconds, then the trace's request id, route, outcome, error, state, key, scope,
operation id and upstream seconds."""

_JSON_LINE = (
    '{"ts": "%s.%03dZ", "level": "info", "logger": "gateway.access", "message": %s, '
    '"event": "request", "request_id": %s, "method": %s, "path": %s, "status": %d, '
    '"route": %s, "outcome": %s, "error": %s, "state": %s, "key": %s, "scope": %s, '
    '"operation_id": %s, "upstream_ms": %s, "total_ms": %s}\n'
)
"""The line `json.dumps` would make of the record's fields, with the constant parts
written once: each request fills in its values, each string escaped as JSON."""


def _text(value: str | None) -> str:
    """A JSON string (ASCII, as `json.dumps` writes it), or null."""
    return "null" if value is None else _quote(value)


class AccessLog:
    """Buffers access lines on the event loop; a thread writes them.

    >>> # access = AccessLog("json", sink=write_to_stderr); access.start()
    >>> # access.request(trace, "POST", "/tickets/v1/issues", 201, elapsed=0.004)
    >>> # await access.close()
    """

    def __init__(self, form: Literal["json", "text"], *, sink: Callable[[str], None]) -> None:
        self._format = self._json_line if form == "json" else self._text_line
        self._sink = sink
        self._pending: list[_Facts] = []
        self._batches: queue.SimpleQueue[list[_Facts] | None] = queue.SimpleQueue()
        self._writer: threading.Thread | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._utc = _SecondStamps("%Y-%m-%dT%H:%M:%S", time.gmtime)
        self._local = _SecondStamps("%Y-%m-%d %H:%M:%S", time.localtime)

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._writer = threading.Thread(target=self._write_batches, name="access-log", daemon=True)
        self._writer.start()

    def request(
        self,
        trace: RequestTrace,
        method: str,
        path: str,
        status: int,
        *,
        elapsed: float,
    ) -> None:
        """Log one finished request. On the event loop only the facts are taken (a tuple);
        the writer thread formats them, while the loop waits on a socket or the store."""
        self._pending.append(
            (
                time.time(),
                method,
                path,
                status,
                elapsed,
                trace.request_id,
                trace.route,
                trace.outcome,
                trace.error,
                trace.state,
                trace.key,
                trace.scope,
                trace.operation_id,
                trace.upstream_seconds,
            )
        )
        if len(self._pending) >= MAX_BATCH:
            self._hand_over()
        elif self._timer is None and self._loop is not None:
            self._timer = self._loop.call_later(FLUSH_SECONDS, self._hand_over)

    async def close(self) -> None:
        """Write every buffered line and stop the writer."""
        self._hand_over()
        writer, self._writer = self._writer, None
        if writer is None:
            return
        self._batches.put(None)
        await asyncio.to_thread(writer.join)

    def _hand_over(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._pending:
            return
        batch, self._pending = self._pending, []
        if self._writer is None:  # not started, or closed: write here rather than lose it
            self._write(batch)
        else:
            self._batches.put(batch)

    def _write_batches(self) -> None:
        while (batch := self._batches.get()) is not None:
            self._write(batch)

    def _write(self, batch: list[_Facts]) -> None:
        form = self._format
        try:
            self._sink("".join([form(*facts) for facts in batch]))
        except Exception:  # a full disk must not end the writer; logging says why
            logging.getLogger(LOGGER).exception("access log lines could not be written")

    def _json_line(
        self,
        now: float,
        method: str,
        path: str,
        status: int,
        elapsed: float,
        request_id: str,
        route: str | None,
        outcome: str | None,
        error: str | None,
        state: str | None,
        key: str | None,
        scope: str | None,
        operation_id: str | None,
        upstream: float | None,
    ) -> str:
        return _JSON_LINE % (
            *self._utc(now),  # 2026-12-02T16:10:00 and 123
            _text(f"{method} {path} {status}"),
            _text(request_id),
            _text(method),
            _text(path),
            status,
            _text(route),
            _text(outcome),
            _text(error),
            _text(state),
            _text(key),
            _text(scope_hash(scope)) if scope else "null",
            _text(operation_id),
            repr(round(upstream * 1000, 3)) if upstream is not None else "null",
            repr(round(elapsed * 1000, 3)),
        )

    def _text_line(self, now: float, method: str, path: str, status: int, *_: object) -> str:
        """As `logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")` wrote it."""
        stamp, millis = self._local(now)
        line = escape_controls(f"{method} {path} {status}")
        return f"{stamp},{millis:03d} INFO {LOGGER}: {line}\n"


class _SecondStamps:
    """A time as `pattern` to the second, and its milliseconds: the formatted part is made
    once a second (the writer thread's alone: nothing else calls it)."""

    def __init__(self, pattern: str, convert: Callable[[float], time.struct_time]) -> None:
        self._pattern = pattern
        self._convert = convert
        self._second = -1
        self._stamp = ""

    def __call__(self, now: float) -> tuple[str, int]:
        second = int(now)
        if second != self._second:
            self._second = second
            self._stamp = time.strftime(self._pattern, self._convert(second))
        return self._stamp, int((now - second) * 1000)


def handler_sink() -> Callable[[str], None]:
    """Write where the root logger's first stream handler writes, under its lock (so no
    other line is interleaved), or to stderr when there is none."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler):
            return _locked_writer(handler)
    return _stream_writer(sys.stderr)


def _locked_writer(handler: logging.StreamHandler[TextIO]) -> Callable[[str], None]:
    lock = handler.lock
    assert lock is not None  # a StreamHandler makes its lock when it is made

    def write(text: str) -> None:
        with lock:
            handler.stream.write(text)
            handler.stream.flush()

    return write


def _stream_writer(stream: TextIO) -> Callable[[str], None]:
    def write(text: str) -> None:
        stream.write(text)
        stream.flush()

    return write


def access_log_for(level: str, form: Literal["json", "text"]) -> AccessLog | None:
    """The access log a `[logging]` configuration asks for: one at `info` and `debug`."""
    if logging.getLevelName(level.upper()) > logging.INFO:
        return None
    return AccessLog(form, sink=handler_sink())
