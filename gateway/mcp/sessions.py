"""MCP session ids bound to the scope that opened them.

An MCP server hands out `Mcp-Session-Id` and trusts whoever sends it back.
Behind one gateway, every client reaches the server with the route's own
credentials, so a session id that leaked (a log, a shared proxy) would let
one client act in another's session. With `[[clients]]`, the gateway gives
each caller `<id>.<tag>`, the tag an HMAC of the caller's scope and the id;
it checks and strips the tag before forwarding, and a session id that does
not carry the caller's own tag is answered 404 (as the server answers an
unknown session), never forwarded.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

__all__ = ["SESSION_HEADER", "SessionTags"]

SESSION_HEADER = "Mcp-Session-Id"
_CONTEXT = b"idempotency-gateway mcp-session\x00"
_TAG_LENGTH = 22  # base64url characters: 132 bits


class SessionTags:
    """Tags and checks session ids for one gateway (keyed by the scope secret).

    >>> tags = SessionTags(b"k" * 32)
    >>> tagged = tags.tag("client:a", "s-1")
    >>> tags.untag("client:a", tagged), tags.untag("client:b", tagged)
    ('s-1', None)
    """

    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    def tag(self, scope: str, session_id: str) -> str:
        return f"{session_id}.{self._mac(scope, session_id)}"

    def untag(self, scope: str, tagged: str) -> str | None:
        """The server's session id, if `tagged` carries this scope's tag; else None."""
        session_id, dot, mac = tagged.rpartition(".")
        if not dot or not hmac.compare_digest(mac, self._mac(scope, session_id)):
            return None
        return session_id

    def _mac(self, scope: str, session_id: str) -> str:
        material = _CONTEXT + scope.encode() + b"\x00" + session_id.encode("utf-8", "replace")
        digest = hmac.new(self._secret, material, hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).decode()[:_TAG_LENGTH]
