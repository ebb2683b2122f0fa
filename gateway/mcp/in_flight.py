"""Protected MCP calls being sent, so that a client's cancellation of one is held back.

A call is named by (scope, session id, JSON of its request id), as a
`notifications/cancelled` names it. With worker processes the cancellation
may reach another worker than the one sending the call (Streamable HTTP
sends it as a POST of its own, often on another connection): each worker
announces its calls through the supervisor (`gateway.workers.channel`) and
keeps the others' announcements, so every worker knows every call in flight.
An announcement arrives within a fraction of a millisecond; a worker that
dies with calls in flight leaves their names behind, and a late cancellation
of such a call is then held back too, which changes nothing (the call is
`unknown` already).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from typing import Protocol

CallHandle = tuple[str, str, str]
"""(scope, session id, JSON of the request id): how a cancellation names a call."""


class CallAnnouncer(Protocol):
    def announce_call(self, call: str, *, started: bool) -> None: ...

    def listen_calls(self, on_call: Callable[[str, bool], None]) -> None: ...


class CallsInFlight:
    """This worker's protected calls being sent, and (with workers) the other workers'.

    >>> calls = CallsInFlight()
    >>> calls.started(("s", "session", "7")); ("s", "session", "7") in calls
    True
    >>> calls.ended(("s", "session", "7")); ("s", "session", "7") in calls
    False
    """

    def __init__(self) -> None:
        self._here: Counter[CallHandle] = Counter()
        self._elsewhere: Counter[CallHandle] = Counter()
        self._announcer: CallAnnouncer | None = None

    def share(self, announcer: CallAnnouncer) -> None:
        """As one of a gateway's workers: announce this worker's calls, hear the others'."""
        self._announcer = announcer
        announcer.listen_calls(self._heard)

    def started(self, handle: CallHandle) -> None:
        self._here[handle] += 1
        if self._announcer is not None:
            self._announcer.announce_call(json.dumps(handle), started=True)

    def ended(self, handle: CallHandle) -> None:
        _take_one(self._here, handle)
        if self._announcer is not None:
            self._announcer.announce_call(json.dumps(handle), started=False)

    def __contains__(self, handle: object) -> bool:
        return handle in self._here or handle in self._elsewhere

    def _heard(self, call: str, started: bool) -> None:
        try:
            scope, session, request_id = json.loads(call)
        except (ValueError, TypeError):
            return  # not a call name this gateway sends
        handle = (str(scope), str(session), str(request_id))
        if started:
            self._elsewhere[handle] += 1
        else:
            _take_one(self._elsewhere, handle)


def _take_one(counts: Counter[CallHandle], handle: CallHandle) -> None:
    left = counts[handle] - 1
    if left > 0:
        counts[handle] = left
    else:
        del counts[handle]
