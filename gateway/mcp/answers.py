"""How a protected `tools/call` is sent, and how the server's answer becomes an outcome.

The engine claims, sends and records; this module tells it, for one MCP call,
what to send (the call with the forwarded key in `params._meta`) and what
the answer means:

- 404 (the server does not know the session: nothing was processed), 401,
  403 and the route's `release_statuses` release the key and pass through as
  the server sent them;
- any other non-2xx, or a 2xx whose body or stream ends without the
  response to this call, is `unknown`: the tool may have run;
- the response to this call is the receipt, kept as the exact bytes
  received, unless it is MCP's "request cancelled" (`-32800`): the tool may
  have applied its effect before the cancellation, so that is `unknown` too
  (`outcome-unknown`: the server cancelled, nothing timed out or broke);
- a result with `resultType: "input_required"` (2026-07-28 multi-round
  calls) is not an answer yet: the server asks the client for input and will
  run the call when the client sends it again with that input (same tool,
  same arguments, same key). The key is released and the round passes on, so
  the next round is claimed and sent like the first.

Progress notifications and other events that come before the response in a
stream are handed to `on_event` as they arrive, so the caller sees them live;
they are not part of the receipt.

A stream that ends (or breaks) before the response, after the server gave
its events ids, is resumed as Streamable HTTP allows: a GET with
`Last-Event-ID`, within the route's `timeout`. Only when that fails too is
the call `unknown`.

The cause recorded is the real one, for a JSON answer and a stream alike:
silence past the route's `timeout` is `upstream-timeout`, a stream that broke
or ended is `upstream-connection-lost`. A resume that fails by its own
silence or break is typed by that; one refused, or out of reach, proves
nothing new and keeps the first stream's cause. The detail, which is also the
operation's evidence, says the same in words.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING

from gateway.engine.errors import (
    UpstreamCancelled,
    UpstreamConnectionLost,
    UpstreamError,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from gateway.engine.exchange import AnswerOutcome, Receipt, Released
from gateway.engine.headers import header_value
from gateway.engine.models import StoredResponse
from gateway.mcp.calls import ToolCall
from gateway.mcp.jsonrpc import REQUEST_CANCELLED, JsonRpcError, parse_message
from gateway.mcp.raw_json import read_raw_response
from gateway.mcp.replies import dumps, strip_owned_meta
from gateway.mcp.sse import SseDecoder, encode_event

if TYPE_CHECKING:
    from gateway.config import RouteSettings
    from gateway.engine.exchange import UpstreamAnswer
    from gateway.mcp.reading import ForwardBody

__all__ = ["RELEASING_STATUSES", "McpCall"]

STREAM_END_GRACE = 0.1
"""Seconds to wait for a stream's end once its response arrived (see `_finish_quietly`)."""

RELEASING_STATUSES = frozenset({401, 403, 404})
"""Statuses that prove the server did not process the call (404: unknown session)."""

JSON_HEADERS = (("Content-Type", "application/json"),)
EVENT_STREAM = "text/event-stream"

EventSink = Callable[[bytes], Awaitable[None]]
Resumer = Callable[[str], Awaitable["UpstreamAnswer"]]
"""Opens the server's stream again after the event with this id (a GET with Last-Event-ID)."""


class McpCall:
    """One protected call's dialect: the engine's `Dialect` for MCP."""

    send_method = "POST"

    def __init__(
        self,
        route: RouteSettings,
        call: ToolCall,
        forward: Callable[[], ForwardBody],
        *,
        on_event: EventSink | None = None,
        resume: Resumer | None = None,
    ) -> None:
        self._route = route
        self._call = call
        self._body = forward
        self._on_event = on_event
        self._resume = resume

    def body_for(self, forwarded_key: str | None) -> bytes:
        """The call as sent upstream: the caller's key replaced by the forwarded key
        (or removed, with `forward_key = false`)."""
        return self._body().with_key(forwarded_key)

    async def outcome(self, answer: UpstreamAnswer) -> AnswerOutcome:
        status = answer.status
        if status in RELEASING_STATUSES or status in self._route.release_statuses:
            body = await answer.read(self._route.max_stored_response) or b""
            return Released(
                status=status,
                headers=answer.headers,
                body=body,
                detail=f"the MCP server refused the call with HTTP {status}; it was not processed",
            )
        if not 200 <= status < 300:
            raise UpstreamConnectionLost(
                f"the MCP server answered HTTP {status} instead of the tool's answer"
            )
        content_type = header_value(answer.headers, "content-type") or ""
        if content_type.split(";", 1)[0].strip().lower() == "text/event-stream":
            return await self._from_stream(answer)
        try:
            whole = await answer.read(self._route.max_stored_response)
        except UpstreamError as exc:
            raise _typed(
                exc, f"the MCP server's JSON answer {self._how(exc)} before it was complete"
            ) from exc
        if whole is None:
            raise UpstreamConnectionLost(
                "the MCP server's answer was larger than max_stored_response"
            )
        receipt = self._receipt_of(whole)
        if receipt is None:
            raise UpstreamConnectionLost("the MCP server's answer holds no response to this call")
        return receipt

    async def _from_stream(self, answer: UpstreamAnswer) -> AnswerOutcome:
        try:
            return await self._read_events(answer)
        except _StreamEnded as ended:
            first = ended
        stopped = f"the MCP server's stream {self._how(first.cause)} before the tool's answer"
        if first.last_id is None or self._resume is None:
            raise _typed(first.cause, stopped) from first.cause
        return await self._resumed(first.last_id, first.cause, stopped)

    async def _resumed(
        self, last_id: str, cause: UpstreamError | None, stopped: str
    ) -> AnswerOutcome:
        """Open the stream again after `last_id` until the response comes, within the
        route's `timeout`; a server that cannot resume leaves the call `unknown`.

        The call is `unknown` for the resume's own cause when it has one (silence is
        a timeout, a broken stream a lost connection), else for the first stream's:
        a resume refused or out of reach proves nothing new."""
        assert self._resume is not None
        try:
            async with asyncio.timeout(self._route.timeout):
                while True:
                    try:
                        answer = await self._resume(last_id)
                    except UpstreamUnreachable as exc:  # proves nothing new: the call went out
                        unreached = f"{stopped}, and the server could not be reached to resume it"
                        raise _typed(cause, unreached) from exc
                    except UpstreamError as exc:
                        raise _typed(exc, f"{stopped}, and resuming it {self._how(exc)}") from exc
                    try:
                        content_type = header_value(answer.headers, "content-type") or ""
                        if answer.status != 200 or not content_type.startswith(EVENT_STREAM):
                            raise _typed(
                                cause,
                                f"{stopped}, and resuming it was answered HTTP {answer.status}",
                            )
                        return await self._read_events(answer, last_id)
                    except _StreamEnded as ended:
                        if ended.last_id == last_id:  # no progress: do not loop
                            how = self._how(ended.cause)
                            resumed = f"{stopped}, and the resumed stream {how} before it too"
                            raise _typed(ended.cause, resumed) from ended.cause
                        last_id = ended.last_id or last_id
                    finally:
                        answer.close()
        except TimeoutError as exc:
            raise UpstreamTimeout(
                f"{stopped}, and resuming it brought no answer within the route's timeout "
                f"({self._route.timeout:g}s)"
            ) from exc

    async def _read_events(
        self, answer: UpstreamAnswer, last_id: str | None = None
    ) -> AnswerOutcome:
        """Read events until the response to this call; `_StreamEnded` (with the last
        event id seen) when the stream ends or breaks first. Only the reading is guarded:
        what an event says (a server's `-32800`) is an answer, not a broken stream."""
        decoder = SseDecoder()
        limit = self._route.max_stored_response
        chunks = aiter(answer.rest())
        while True:
            try:
                chunk = await anext(chunks)
            except StopAsyncIteration:
                raise _StreamEnded(last_id, None) from None
            except UpstreamError as exc:
                raise _StreamEnded(last_id, exc) from exc
            for event in decoder.feed(chunk):
                last_id = event.id if event.id is not None else last_id
                data = event.data.encode()
                receipt = self._receipt_of(data) if len(data) <= limit else None
                if receipt is not None:
                    await _finish_quietly(chunks)
                    return receipt
                await self._forward(encode_event(event.data, event=_named(event.event)))

    def _how(self, cause: UpstreamError | None) -> str:
        """How an answer stopped short, in words that name the cause."""
        if isinstance(cause, UpstreamTimeout):
            return f"fell silent for the route's timeout ({self._route.timeout:g}s)"
        return "ended" if cause is None else "broke"

    def _receipt_of(self, data: bytes) -> Receipt | Released | None:
        """The receipt, when `data` is the response to this call; None otherwise.

        An answer the parser cannot read whole (a number too long to convert,
        nesting too deep) is still this call's answer when its top level says so:
        it is kept as the bytes received, since the tool ran and answered."""
        try:
            message = parse_message(data)
        except JsonRpcError:
            raw = read_raw_response(data)
            if raw is None or raw.id != self._call.id:
                return None
            return self._answered(data, raw.error_code, raw.result_type) or Receipt(
                StoredResponse(status=200, headers=JSON_HEADERS, body=data)
            )
        if message.kind != "response" or message.id != self._call.id:
            return None
        error = message.document.get("error")
        result = message.document.get("result")
        released = self._answered(
            data,
            error.get("code") if isinstance(error, dict) else None,
            result.get("resultType") if isinstance(result, dict) else None,
        )
        if released is not None:
            return released
        cleaned = strip_owned_meta(message.document)
        body = data if cleaned == message.document else dumps(cleaned)
        return Receipt(StoredResponse(status=200, headers=JSON_HEADERS, body=body))

    @staticmethod
    def _answered(data: bytes, error_code: object, result_type: object) -> Released | None:
        """What a response that is not a receipt means: a server's cancellation (the
        call is `unknown`) or a request for input (the call has not run); None for a
        receipt."""
        if error_code == REQUEST_CANCELLED:
            raise UpstreamCancelled(
                "the MCP server cancelled the call (-32800, request cancelled): the tool may "
                "have applied its effect before the cancellation"
            )
        if result_type == "input_required":
            return Released(
                status=200,
                headers=JSON_HEADERS,
                body=data,
                detail="the server asked for input (input_required); the call has not run yet",
            )
        return None

    async def _forward(self, event: bytes) -> None:
        if self._on_event is not None:
            await self._on_event(event)


class _StreamEnded(Exception):
    """A stream ended (or broke, or fell silent: `cause`) before the response; `last_id`
    is the id of the last event it carried, where it could be resumed."""

    def __init__(self, last_id: str | None, cause: UpstreamError | None) -> None:
        super().__init__(last_id)
        self.last_id = last_id
        self.cause = cause


async def _finish_quietly(chunks: AsyncIterator[bytes]) -> None:
    """Read what a stream still holds once the response is in (servers close it right
    after): a stream read to its end leaves its connection reusable, where one cut
    short is closed and the next call pays a new connection. Bounded: the receipt
    does not wait on a server that keeps its stream open."""
    with contextlib.suppress(TimeoutError, UpstreamError):
        async with asyncio.timeout(STREAM_END_GRACE):
            async for _ in chunks:
                pass


def _typed(cause: UpstreamError | None, detail: str) -> UpstreamError:
    """The error that makes the call `unknown`, of the cause's type: silence past the
    route's `timeout` is a timeout; a broken or ended stream is a lost connection."""
    internal = cause.internal if cause is not None else None
    if isinstance(cause, UpstreamTimeout):
        return UpstreamTimeout(detail, internal=internal)
    return UpstreamConnectionLost(detail, internal=internal)


def _named(event: str) -> str | None:
    return None if event == "message" else event
