"""Operation ids: sortable by creation time, unguessable, safe in URLs.

A ULID-shaped id (48 bits of milliseconds, 80 random bits, Crockford base32)
keeps admin listings in creation order without a second index, and carries no
information about the key or the scope that made it.
"""

from __future__ import annotations

import os
import time

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def new_operation_id(now: float | None = None) -> str:
    """A fresh operation id.

    >>> new_operation_id(0.0)[:13]
    'op_0000000000'
    """
    millis = int((time.time() if now is None else now) * 1000) & ((1 << 48) - 1)
    value = (millis << 80) | int.from_bytes(os.urandom(10), "big")
    chars = []
    for _ in range(26):
        chars.append(_CROCKFORD[value & 31])
        value >>= 5
    return "op_" + "".join(reversed(chars))
