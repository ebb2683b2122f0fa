"""The key of an MCP call that came without one, and the keys such calls had before.

A derived key names the call's arguments, and it is stored and shown like any
key: as a plain hash it would let anyone who reads it confirm a guess of the
arguments, so it is keyed per scope (`gateway.engine.digests`). Calls made
before that upgrade carry the plain form, under the scope of their time
(`gateway.engine.scopes`); their retry must find them, or a crash-retry across
the upgrade would be a second effect. So for one `derived_key_retention` after
the upgrade (plus room for the clocks to disagree) a call whose keyed key is not
in the store is looked up under its plain key too, and takes it when found.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from gateway.engine.digests import Digests
from gateway.engine.scopes import CallerScope
from gateway.mcp.calls import ToolCall, derived_key

__all__ = ["DerivedKeys"]

CLOCK_MARGIN = 3600.0
"""Seconds past the retention during which plain keys are still looked up: room for the
gateway host's clock to disagree with the store's, which dated the upgrade."""

Find = Callable[[str, str], Awaitable[object | None]]
"""The store's `get(scope, key)`."""


class DerivedKeys:
    """Derives keys for calls without one; finds the plain keys of calls made before."""

    def __init__(
        self,
        digests: Digests,
        *,
        plain_since: float | None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`plain_since`: when the store's gateway began to key derived keys, None when
        it had no operations then (`Store.upgraded_since`)."""
        self._digests = digests
        self._plain_since = plain_since
        self._clock = clock

    def of(self, scope: str, route: str, call: ToolCall) -> str:
        """The call's derived key in `scope`: `d:` + base64url(HMAC(scope key, SHA-256
        of route, tool and canonical arguments))."""
        return self._digests.derived_key(scope, derived_key(route, call))

    async def settled(
        self, caller: CallerScope, route: str, call: ToolCall, retention: float, find: Find
    ) -> tuple[CallerScope, str]:
        """The scope and key a call without a key is claimed under: its keyed key, unless
        a call made before the upgrade, within `retention`, has its plain one."""
        keyed = self.of(caller.scope, route, call)
        since = self._plain_since
        if since is None or self._clock() >= since + retention + CLOCK_MARGIN:
            return caller, keyed
        if await find(caller.scope, keyed) is not None:
            return caller, keyed
        plain = derived_key(route, call)
        if await find(caller.scope, plain) is not None:
            return caller, plain
        if caller.legacy is not None and await find(caller.legacy, plain) is not None:
            return CallerScope(caller.legacy, caller.strips_authorization), plain
        return caller, keyed
