"""Logging setup: JSON lines for machines or plain text for people, from config."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import TYPE_CHECKING, Any

from aiohttp.http_exceptions import HttpProcessingError

if TYPE_CHECKING:
    from gateway.config import LoggingSettings

_STANDARD = frozenset(vars(logging.makeLogRecord({})))


class JsonFormatter(logging.Formatter):
    """One JSON object a line; fields passed with `extra=` become top-level keys."""

    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name, value in vars(record).items():
            if name not in _STANDARD and not name.startswith("_"):
                document[name] = value
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        return json.dumps(document, default=str)


_CONTROLS = {code: f"\\x{code:02x}" for code in (*range(0x20), 0x7F, *range(0x80, 0xA0))} | {
    0x2028: "\\u2028",
    0x2029: "\\u2029",
}
"""Characters that end or rewrite a line on a terminal, as the escapes that show them."""


def escape_controls(text: str) -> str:
    """`text` with every control character (and Unicode line separator) escaped: a caller's
    `%0A` in a path must not start a line of its own in a text log.

    >>> escape_controls("/t\\nINFO gateway.admin: resolved")
    '/t\\\\x0aINFO gateway.admin: resolved'
    """
    return text.translate(_CONTROLS)


class TextFormatter(logging.Formatter):
    """`time LEVEL logger: message`, a line each: control characters in the message (and
    so in every field a message names) are escaped; a traceback follows on lines of its
    own, as Python writes it."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escape_controls(record.message)
        return super().formatMessage(record)


PARSER_LINES_PER_SECOND = 10
"""At most this many malformed-request lines a second: a flood of bad requests must not
turn into a flood of log lines."""


class MalformedRequestFilter(logging.Filter):
    """The HTTP parser's refusals, logged as one line that holds none of the request's bytes.

    aiohttp logs a request its parser refuses with a traceback whose message
    quotes the raw header line around the fault: a malformed `Authorization`
    line (a CR left by a Windows env file, a bare LF, DEL, NUL, a space before
    the colon) put the token in the log, on the admin listener as much as on the
    main one. This filter, on aiohttp's server logger, replaces such a record
    with the parser's reason and the peer, no traceback, and rate-limits them.
    """

    def __init__(self, *, per_second: int = PARSER_LINES_PER_SECOND) -> None:
        super().__init__()
        self._per_second = per_second
        self._second = 0
        self._count = 0
        self._dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, HttpProcessingError):
            return True
        now = int(time.monotonic())
        if now != self._second:
            self._second, self._count = now, 0
        self._count += 1
        if self._count > self._per_second:
            self._dropped += 1
            return False
        peer = record.args[0] if isinstance(record.args, tuple) and record.args else None
        record.msg = "malformed request refused (%s) from %s"
        record.args = (parser_reason(exc), peer)
        record.exc_info = None
        record.exc_text = None
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.event = "malformed_request"
        if self._dropped:
            record.dropped = self._dropped  # lines left out since the last one
            self._dropped = 0
        return True


def parser_reason(exc: HttpProcessingError) -> str:
    r"""The parser's reason without the request bytes it quotes: the first line of its
    message, up to the first colon, letters and spaces only.

    >>> from aiohttp.http_exceptions import BadHttpMessage
    >>> parser_reason(BadHttpMessage("\n  Invalid header value char:\n\n    b'Bearer x'\n  ^"))
    'Invalid header value char'
    """
    first = next((line.strip() for line in str(exc.message).splitlines() if line.strip()), "")
    reason = first.split(":", 1)[0]
    kept = "".join(char for char in reason if char.isalpha() or char in " -")[:80].strip()
    return kept or type(exc).__name__


def configure_logging(settings: LoggingSettings) -> None:
    server = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, MalformedRequestFilter) for f in server.filters):
        server.addFilter(MalformedRequestFilter())
    handler = logging.StreamHandler(sys.stderr)
    if settings.format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.level.upper())
