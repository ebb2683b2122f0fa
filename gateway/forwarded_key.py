"""The forwarded key: the one value that tells the upstream which effect a request is.

Computed here and nowhere else, because two places use it and they must
agree: the request sent upstream carries it (as `Idempotency-Key`) and a
probe asks for it (`{forwarded_key}` in the probe path). A probe that asked
for any other value would hear "not applied" about an effect that exists,
and the key would be sent again.

It is stable for the operation's whole life: every attempt of one key
carries the same value.

>>> # forwarded_key(route, operation) -> 'op_01J...' (forward_key = "operation_id")
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.config import RouteSettings
    from gateway.models import Operation

__all__ = ["forwarded_key"]


def forwarded_key(route: RouteSettings, operation: Operation) -> str | None:
    """The value the route forwards for this operation; `None` with `forward_key = false`."""
    forward = route.forward_key
    if forward is False:
        return None
    return operation.id if forward == "operation_id" else operation.key
