"""Every request an MCP route has seen lately, shared by the workers: what a client's
`notifications/cancelled` is matched against, so that it never overtakes its call.

Streamable HTTP sends a cancellation as a POST of its own, often on another
connection, so with worker processes it may reach another worker than the
call it names, and before that call is known there. Each worker therefore
writes every request it handles here before it sends it on, and announces it
to the others through the supervisor (`gateway.workers.channel`); a worker
that holds a cancellation for a name nobody knows yet is woken by the
announcement (`until_known`), not by polling.

A call is named by a digest of (scope, session id or none, JSON of the request
id), as a cancellation names it: announcements carry the digest, never a
scope or a session. A name is known while some worker handles the request, and
for `KEPT_SECONDS` after, so that a cancellation that crossed the answer is
still matched (at most `MAX_ENDED` ended names are kept: past that the oldest
go first). A worker that dies while handling requests leaves their names
behind; holding back a late cancellation of such a call changes nothing (it
is `unknown` already).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from typing import Final, Protocol

KEPT_SECONDS = 10.0
"""How long a name stays known after the last worker handling it is done."""
MAX_ENDED = 32768
"""Ended names kept at most (a few MiB); under a heavier load they are kept less long."""
_DIGEST_BYTES = 16


class Known(Enum):
    """What a cancellation of a known name finds."""

    PROTECTED = "P"
    """A protected call (recorded): its cancellation is dropped."""
    UNPROTECTED = "U"
    """Anything else the route forwarded: its cancellation is forwarded."""


def call_name(scope: str, session: str | None, request_id: object) -> str:
    """The digest a request and its cancellation share.

    >>> call_name("s", None, 7) == call_name("s", None, 7) != call_name("s", None, "7")
    True
    """
    material = json.dumps([scope, session, json.dumps(request_id)], separators=(",", ":"))
    return hashlib.blake2b(material.encode(), digest_size=_DIGEST_BYTES).hexdigest()


class CallAnnouncer(Protocol):
    def announce_call(self, call: str, *, started: bool) -> None: ...

    def listen_calls(self, on_call: Callable[[str, bool], None]) -> None: ...


HELD: Final = "C"
"""The announcement that a worker held back a cancellation of a protected call: the worker
handling that call (which alone knows its key) records it."""

CallRef = tuple[str, str, str]
"""A protected call's (scope, key, fingerprint), known only to the worker that handles it."""


@dataclass(slots=True)
class _Entry:
    kind: Known
    ref: CallRef | None = None
    """The protected call's (scope, key, fingerprint), when this worker handles (or
    handled) it."""
    here: int = 0
    """Requests of this name this worker handles now."""
    elsewhere: int = 0
    """... and the other workers, as announced."""
    forget_at: float | None = None
    """Once nobody handles it: when it is forgotten."""


class KnownCalls:
    """The names of the requests this worker and (with workers) the others handle, or
    handled within `kept` seconds.

    >>> calls = KnownCalls()
    >>> name = call_name("scope", "session", 7)
    >>> calls.started(name, protected=True); calls.known(name)
    <Known.PROTECTED: 'P'>
    >>> calls.ended(name); calls.known(name)  # still, for a while
    <Known.PROTECTED: 'P'>
    >>> calls.known(call_name("scope", "session", 8)) is None
    True
    """

    def __init__(
        self,
        *,
        kept: float = KEPT_SECONDS,
        max_ended: int = MAX_ENDED,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._kept = kept
        self._max_ended = max_ended
        self._clock = clock
        self._entries: dict[str, _Entry] = {}
        self._ended: deque[tuple[float, str]] = deque()
        self._waiters: dict[str, list[asyncio.Future[None]]] = {}
        self._announcer: CallAnnouncer | None = None
        self._record_held: Callable[[CallRef], object] | None = None

    def share(self, announcer: CallAnnouncer) -> None:
        """As one of a gateway's workers: announce this worker's requests, hear the others'."""
        self._announcer = announcer
        announcer.listen_calls(self._heard)

    @contextmanager
    def handling(self, name: str, *, protected: bool, ref: CallRef | None = None) -> Iterator[None]:
        """`with calls.handling(name, protected=...):` around a request's whole handling,
        entered before it is sent on; `ref`, a protected call's (scope, key, fingerprint),
        names it
        when its cancellation is held back (`held_back`)."""
        self.started(name, protected=protected, ref=ref)
        try:
            yield
        finally:
            self.ended(name)

    def started(self, name: str, *, protected: bool, ref: CallRef | None = None) -> None:
        kind = Known.PROTECTED if protected else Known.UNPROTECTED
        entry = self._start(name, kind)
        entry.here += 1
        if ref is not None:
            entry.ref = ref
        if self._announcer is not None:
            self._announcer.announce_call(kind.value + name, started=True)

    def ended(self, name: str) -> None:
        entry = self._entries.get(name)
        if entry is not None and entry.here > 0:
            entry.here -= 1
            self._maybe_forget(name, entry)
        if self._announcer is not None:
            self._announcer.announce_call(Known.UNPROTECTED.value + name, started=False)

    def on_held_back(self, record: Callable[[CallRef], object]) -> None:
        """`record(ref)` for each held-back cancellation of a call this worker handles."""
        self._record_held = record

    def held_back(self, name: str) -> None:
        """A cancellation of the protected call `name` was held back here: recorded here
        when this worker handles the call, else announced to the one that does."""
        entry = self._entries.get(name)
        if entry is not None and entry.ref is not None:
            if self._record_held is not None:
                self._record_held(entry.ref)
        elif self._announcer is not None:
            self._announcer.announce_call(HELD + name, started=True)

    def known(self, name: str) -> Known | None:
        """PROTECTED when any request of this name was a protected call, UNPROTECTED when
        it is known otherwise, None when no worker has announced it (lately)."""
        self._prune()
        entry = self._entries.get(name)
        return None if entry is None else entry.kind

    async def until_known(self, name: str, seconds: float) -> None:
        """Return once `name` is known, or after `seconds`, whichever comes first."""
        if self.known(name) is not None or seconds <= 0:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiters = self._waiters.setdefault(name, [])
        waiters.append(waiter)
        try:
            async with asyncio.timeout(seconds):
                await waiter
        except TimeoutError:
            pass
        finally:
            if waiter in waiters:
                waiters.remove(waiter)
            if not waiters and self._waiters.get(name) is waiters:
                del self._waiters[name]

    def __len__(self) -> int:
        self._prune()
        return len(self._entries)

    def _start(self, name: str, kind: Known) -> _Entry:
        self._prune()
        entry = self._entries.get(name)
        if entry is None:
            entry = self._entries[name] = _Entry(kind)
        elif kind is Known.PROTECTED:
            entry.kind = kind  # a name once protected stays so: dropping is always safe
        entry.forget_at = None
        for waiter in self._waiters.pop(name, ()):
            if not waiter.done():
                waiter.set_result(None)
        return entry

    def _maybe_forget(self, name: str, entry: _Entry) -> None:
        if entry.here or entry.elsewhere:
            return
        entry.forget_at = self._clock() + self._kept
        self._ended.append((entry.forget_at, name))
        self._prune()

    def _prune(self) -> None:
        now = self._clock()
        ended = self._ended
        while ended and (ended[0][0] <= now or len(ended) > self._max_ended):
            forget_at, name = ended.popleft()
            entry = self._entries.get(name)
            if entry is not None and entry.forget_at == forget_at:
                del self._entries[name]

    def _heard(self, call: str, started: bool) -> None:
        if call[:1] == HELD:
            entry = self._entries.get(call[1:])
            if entry is not None and entry.ref is not None and self._record_held is not None:
                self._record_held(entry.ref)
            return
        try:
            kind, name = Known(call[:1]), call[1:]
        except ValueError:
            return  # not a name this gateway announces
        if len(name) != 2 * _DIGEST_BYTES:
            return
        if started:
            self._start(name, kind).elsewhere += 1
            return
        entry = self._entries.get(name)
        if entry is not None and entry.elsewhere > 0:
            entry.elsewhere -= 1
            self._maybe_forget(name, entry)
