"""Server-Sent Events, read incrementally and written back.

An MCP server may answer a `tools/call` with a `text/event-stream`: progress
notifications first, the JSON-RPC response last. The gateway must forward
each event when it arrives (a progress bar that only moves when the call is
over is no progress bar) and keep the response as the receipt, so it reads
the stream event by event as bytes come in.

The reading follows the WHATWG event-stream rules: lines end in CRLF, LF or
CR; `data:` lines join with LF; a line starting with `:` is a comment; a
blank line dispatches the event. One leading space after the colon is not
part of the value.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SseDecoder", "SseEvent", "encode_event"]


@dataclass(frozen=True, slots=True)
class SseEvent:
    """One dispatched event: its type (`message` unless named), data and id."""

    data: str
    event: str = "message"
    id: str | None = None


class SseDecoder:
    """Feed bytes as they arrive; get the events completed so far.

    >>> decoder = SseDecoder()
    >>> decoder.feed(b'event: message\\nid: 1\\ndata: {"a"')
    []
    >>> decoder.feed(b': 1}\\n\\n: ping\\n\\n')
    [SseEvent(data='{"a": 1}', event='message', id='1')]
    """

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[str] = []
        self._event = ""
        self._id: str | None = None
        self._last_was_cr = False

    def feed(self, chunk: bytes) -> list[SseEvent]:
        if self._last_was_cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]  # the LF of a CRLF split across two chunks
        self._last_was_cr = chunk.endswith(b"\r")
        self._buffer += chunk
        events: list[SseEvent] = []
        while True:
            end, width = _line_end(self._buffer)
            if end < 0:
                return events
            line = self._buffer[:end].decode("utf-8", "replace")
            self._buffer = self._buffer[end + width :]
            event = self._line(line)
            if event is not None:
                events.append(event)

    def _line(self, line: str) -> SseEvent | None:
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\x00" not in value:
            self._id = value
        return None

    def _dispatch(self) -> SseEvent | None:
        if not self._data:
            self._event = ""
            return None
        event = SseEvent(data="\n".join(self._data), event=self._event or "message", id=self._id)
        self._data, self._event = [], ""
        return event


def _line_end(buffer: bytes) -> tuple[int, int]:
    """Where the first complete line ends, and the width of its terminator.

    A CR at the very end may be the first half of a CRLF: it ends the line now,
    and `feed` drops the LF if it comes next.
    """
    cr, lf = buffer.find(b"\r"), buffer.find(b"\n")
    if cr < 0 and lf < 0:
        return -1, 0
    if cr < 0 or (0 <= lf < cr):
        return lf, 1
    if cr + 1 < len(buffer) and buffer[cr + 1 : cr + 2] == b"\n":
        return cr, 2
    return cr, 1


def encode_event(data: str, *, event: str | None = None, event_id: str | None = None) -> bytes:
    """One event as bytes. The gateway's own events carry no `id:` line (its answers
    are not resumable: a replay is answered whole, and a protected call's stream is
    re-sent by the gateway itself); a server's event passed on keeps its id.

    >>> encode_event('{"a":1}', event="message")
    b'event: message\\ndata: {"a":1}\\n\\n'
    """
    lines = [f"event: {event}"] if event else []
    if event_id is not None:
        lines.append(f"id: {event_id}")
    lines += [
        f"data: {part}" for part in data.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    ]
    return ("\n".join(lines) + "\n\n").encode()
