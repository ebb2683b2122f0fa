"""How long the client keeps retrying an answer that says it is safe to retry."""

from __future__ import annotations

import email.utils
import time
from dataclasses import dataclass

__all__ = ["Backoff", "parse_retry_after"]


@dataclass(frozen=True)
class Backoff:
    """Bounded retries for answers with `safe_to_retry: true` (same request, same key).

    Each retry waits `Retry-After` when the gateway sent one, otherwise
    `initial` doubling up to `maximum`. The client gives up, raising the last
    problem, after `attempts` sends or once the next wait would pass `total`
    seconds of waiting.

    >>> Backoff(attempts=5, total=10.0)
    Backoff(attempts=5, total=10.0, initial=0.2, maximum=5.0)
    >>> Backoff.none().attempts
    1
    """

    attempts: int = 20
    total: float = 30.0
    initial: float = 0.2
    maximum: float = 5.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"Backoff.attempts must be >= 1, got {self.attempts!r}")
        if self.total < 0:
            raise ValueError(f"Backoff.total must be >= 0, got {self.total!r}")
        if self.initial <= 0:
            raise ValueError(f"Backoff.initial must be > 0, got {self.initial!r}")
        if self.maximum < self.initial:
            raise ValueError(
                f"Backoff.maximum must be >= initial ({self.initial!r}), got {self.maximum!r}"
            )

    @classmethod
    def none(cls) -> Backoff:
        """Never retry: every problem is raised at once."""
        return cls(attempts=1, total=0.0)

    def delay(self, retry: int, retry_after: float | None) -> float:
        """Seconds to wait before retry number `retry` (0 for the first retry)."""
        if retry_after is not None:
            return max(0.0, retry_after)
        return float(min(self.maximum, self.initial * 2**retry))

    def next_delay(self, sent: int, waited: float, retry_after: float | None) -> float | None:
        """The wait before the next send after `sent` sends and `waited` seconds; None: give up."""
        if sent >= self.attempts:
            return None
        delay = self.delay(sent - 1, retry_after)
        if waited + delay > self.total:
            return None
        return delay


def parse_retry_after(value: str | None) -> float | None:
    """`Retry-After` as seconds from now: delta-seconds or an HTTP date; None when absent or bad.

    >>> parse_retry_after("3")
    3.0
    """
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())
