"""What a run reports while it advances, for progress output, logs and tests."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from idempotency_gateway_client._models import SimilarTwin
from idempotency_gateway_client._records import PlannedCall, ToolResult

__all__ = ["EventKind", "RunEvent", "RunObserver"]

EventKind = Literal["planned", "lookup", "sending", "took_over", "response", "recorded", "finished"]


@dataclass(frozen=True)
class RunEvent:
    """One thing a `Run` did, reported to its `on_event` observer when it happens.

    By kind, and when it is reported:

    - `planned`: a turn's calls are durably in the journal; none has run yet.
    - `lookup`: a call left without a result (by a crash, or an error) was
      looked up at the gateway; `state` is the answer (`absent` for a 404).
    - `sending`: the call is about to be sent through the gateway.
    - `took_over`: the gateway refused the call's key as the same request as
      another key's operation (`similar-operation`), and the call is about to be
      sent again under that key (`twin.key`; `state` is the twin's), so that
      its answer, a replay of the twin's receipt, is this call's result. The
      journal keeps the call's own key.
    - `response`: the gateway answered the call with the tool's answer (the
      effect exists); `result` is not in the journal yet.
    - `recorded`: the call's `result` is durably in the journal (`result.source`
      says whether it came from a response or from a receipt found by lookup).
    - `finished`: the run is durably marked finished (also when a run opens finished: a
      rerun does nothing, and says so).

    The observer runs on the event loop, synchronously; an exception it
    raises propagates out of the `Run` method that reported the event.

    >>> Run(journal, ..., on_event=lambda event: print(event.kind, event.key))
    """

    kind: EventKind
    run_id: str
    turn: int | None = None
    call: PlannedCall | None = None
    state: str | None = None
    result: ToolResult | None = None
    twin: SimilarTwin | None = None
    """For `took_over`: the operation whose key the call was sent under."""

    @property
    def call_id(self) -> str | None:
        """The model's id of the call, for events about a call."""
        return self.call.call_id if self.call is not None else None

    @property
    def key(self) -> str | None:
        """The call's idempotency key, for events about a call."""
        return self.call.key if self.call is not None else None


RunObserver = Callable[[RunEvent], None]
