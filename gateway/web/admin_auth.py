"""Who calls the admin API, and what their token's role lets them do.

A named token (`[[admin.tokens]]`) names its holder: the history's actor is
that name, whatever `X-Admin-Actor` says (which only adds a free-text label),
and its role bounds what it may do. The single `[admin] token` stays, as the
role `admin`, its actor the label it is given (or "admin"). Roles are ordered:
`viewer` reads; `operator` also resolves without force, probes and attaches
receipts; `admin` also forces a release, redacts and trusts a probe.

Named tokens are kept as SHA-256 digests, so the config cannot say whether one
is strong: it is checked when used, and a guessable one is refused.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Final

from aiohttp import web

from gateway.config import MIN_ADMIN_TOKEN_LENGTH
from gateway.config.sections import AdminRole, guessable
from gateway.engine.errors import InvalidRequest, NotFound, RoleForbidden, Unauthorized
from gateway.engine.scopes import header_bytes
from gateway.web.appkeys import SETTINGS

__all__ = [
    "ADMIN_ACTOR",
    "ROLE_ADMIN",
    "ROLE_OPERATOR",
    "ROLE_VIEWER",
    "AdminIdentity",
    "actor_of",
    "require_role",
]

ROLE_VIEWER: Final = "viewer"
ROLE_OPERATOR: Final = "operator"
ROLE_ADMIN: Final = "admin"
_RANK: dict[AdminRole, int] = {ROLE_VIEWER: 0, ROLE_OPERATOR: 1, ROLE_ADMIN: 2}
ADMIN_ACTOR: Final = "X-Admin-Actor"
"""A free-text label of who acts (the console asks for it at sign-in, the CLI sends
`--actor`): the actor itself for the shared token, an addition to a named token's name."""


@dataclass(frozen=True, slots=True)
class AdminIdentity:
    """The holder of the token a request carried: a named token's name, or None for the
    shared `[admin] token`; and its role."""

    name: str | None
    role: AdminRole


_IDENTITY = web.RequestKey("admin_identity", AdminIdentity)
"""The identity found once per request (a resolve asks again for a forced release)."""


def require_role(request: web.Request, role: AdminRole, *, doing: str = "") -> AdminIdentity:
    """The caller's identity, when its token may act as `role`: 404 while the admin API
    is off, 401 without a valid token, 403 `role-forbidden` for a role below `role`."""
    identity = _identity(request)
    if _RANK[identity.role] < _RANK[role]:
        what = doing or f"this needs the role {role!r}"
        raise RoleForbidden(
            f"the token of {identity.name!r} has the role {identity.role!r}: {what}; "
            f"ask someone with the role {role!r}"
        )
    return identity


def actor_of(request: web.Request) -> str:
    """The history's actor: `admin:<token name>` for a named token, with `X-Admin-Actor`
    as a label in parentheses; for the shared token `admin:<label>`, or `admin`."""
    identity = _identity(request)
    label = _label(request)
    if identity.name is None:
        return f"admin:{label}" if label else "admin"
    return f"admin:{identity.name} ({label})" if label else f"admin:{identity.name}"


def _identity(request: web.Request) -> AdminIdentity:
    known: AdminIdentity | None = request.get(_IDENTITY)
    if known is not None:
        return known
    settings = request.app[SETTINGS].admin
    if not settings.enabled:
        raise NotFound("the admin endpoints are disabled (no admin token is configured)")
    scheme, _, offered = request.headers.get("Authorization", "").strip().partition(" ")
    offered = offered.strip()
    if scheme.lower() != "bearer" or not offered:
        raise Unauthorized("a valid 'Authorization: Bearer <admin token>' is required")
    presented = header_bytes(offered)
    shared = settings.token.get_secret_value()
    identity: AdminIdentity | None = None
    if shared and hmac.compare_digest(presented, shared.encode()):
        identity = AdminIdentity(None, ROLE_ADMIN)
    else:
        digest = hashlib.sha256(presented).hexdigest()
        for token in settings.tokens:
            if hmac.compare_digest(digest, token.token_sha256):
                _check_strength(offered)
                identity = AdminIdentity(token.name, token.role)
                break
    if identity is None:
        raise Unauthorized("a valid 'Authorization: Bearer <admin token>' is required")
    request[_IDENTITY] = identity
    return identity


def _check_strength(token: str) -> None:
    """A named token is a digest in the config: its strength shows only when it is used."""
    if len(token) < MIN_ADMIN_TOKEN_LENGTH or (why := guessable(token)) is not None:
        reason = (
            f"shorter than {MIN_ADMIN_TOKEN_LENGTH} characters"
            if len(token) < MIN_ADMIN_TOKEN_LENGTH
            else why
        )
        raise Unauthorized(
            f"this admin token is guessable ({reason}): make one with "
            "`idempotency-gateway token` and put its SHA-256 in [[admin.tokens]]"
        )


def _label(request: web.Request) -> str:
    name = request.headers.get(ADMIN_ACTOR, "").strip()
    if name and (len(name) > 64 or not all(" " <= char <= "~" for char in name)):
        raise InvalidRequest(f"{ADMIN_ACTOR} must be 1 to 64 printable ASCII characters")
    return name
