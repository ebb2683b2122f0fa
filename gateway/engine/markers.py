"""`Idempotency-Distinct`: how a caller says "a second effect, on purpose".

The guard against the same request under a new key (`gateway.engine.twins`)
refuses what looks like a lost key's retry. An agent that really means the
same request twice (two identical tickets, a second identical payment) says
so with this Structured Field boolean, `?1`. The marker is the gateway's:
never part of the fingerprint, never forwarded. Anything but `?1` or `?0`,
once, is refused rather than guessed: a misspelled marker read as "not
distinct" refuses a call the caller meant, one read as "distinct" lets a
duplicate through.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.engine.errors import InvalidRequest

if TYPE_CHECKING:
    from collections.abc import Sequence

IDEMPOTENCY_DISTINCT = "Idempotency-Distinct"

_OWS = " \t"


def parse_distinct(values: Sequence[str]) -> bool:
    """Whether the request is marked distinct, from every `Idempotency-Distinct` value.

    >>> parse_distinct([]), parse_distinct(["?1"]), parse_distinct([" ?0 "])
    (False, True, False)
    >>> parse_distinct(["true"])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    gateway.engine.errors.InvalidRequest: Idempotency-Distinct must be ... got 'true'
    """
    if not values:
        return False
    if len(values) > 1:
        raise InvalidRequest("Idempotency-Distinct was sent more than once; send it once")
    value = values[0].strip(_OWS)
    if value == "?1":
        return True
    if value == "?0":
        return False
    raise InvalidRequest(
        f"{IDEMPOTENCY_DISTINCT} must be the Structured Field boolean ?1 (or ?0); "
        f"got {value[:40]!r}"
    )
