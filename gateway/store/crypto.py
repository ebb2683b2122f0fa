"""Optional encryption of stored response bodies at rest (AES-256-GCM).

Receipts can hold personal data, tokens and money movements; a stolen
database file or backup should not hand them over. With `[store]
encryption_keys` set, every stored body is sealed with the first key; any
listed key opens it, so keys rotate without a migration: put the new key
first, keep the old ones until every receipt sealed with them has expired
(`retention`), then drop them. Stored response headers are sealed the same
way. Whether a row's receipt is sealed is said by the row itself (its
`storage` column), never guessed from the first bytes: an upstream body that
happens to start like a sealed one is plain bytes and replays as it came.

The operation id is bound as associated data, so a sealed body cannot be
moved to another operation's row unnoticed.
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Sequence

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

MAGIC = b"IGE1"
_KEY_ID_BYTES = 8
_NONCE_BYTES = 12


class CipherError(Exception):
    """A sealed body could not be opened: unknown key, or tampered with."""


class BodyCipher:
    """Seals and opens stored bodies.

    >>> key = base64.b64encode(bytes(32)).decode()
    >>> cipher = BodyCipher([key])
    >>> cipher.open(cipher.seal(b"receipt", "op_1"), "op_1")
    b'receipt'
    """

    def __init__(self, keys: Sequence[str]) -> None:
        if not keys:
            raise ValueError("at least one key is needed")
        self._keys: dict[bytes, AESGCM] = {}
        self._current: bytes = b""
        for index, encoded in enumerate(keys):
            raw = base64.b64decode(encoded, validate=True)
            key_id = hashlib.sha256(raw).digest()[:_KEY_ID_BYTES]
            self._keys[key_id] = AESGCM(raw)
            if index == 0:
                self._current = key_id

    def seal(self, plain: bytes, operation_id: str) -> bytes:
        nonce = os.urandom(_NONCE_BYTES)
        sealed = self._keys[self._current].encrypt(nonce, plain, operation_id.encode())
        return MAGIC + self._current + nonce + sealed

    def open(self, stored: bytes, operation_id: str) -> bytes:
        """Open what `seal` returned (the row says it is sealed); `CipherError` otherwise."""
        if not stored.startswith(MAGIC):
            raise CipherError(f"the stored receipt of {operation_id} is not a sealed envelope")
        header = len(MAGIC)
        key_id = stored[header : header + _KEY_ID_BYTES]
        nonce = stored[header + _KEY_ID_BYTES : header + _KEY_ID_BYTES + _NONCE_BYTES]
        sealed = stored[header + _KEY_ID_BYTES + _NONCE_BYTES :]
        aead = self._keys.get(key_id)
        if aead is None:
            raise CipherError(
                f"the body of {operation_id} was sealed with a key that is no longer configured"
            )
        try:
            return aead.decrypt(nonce, sealed, operation_id.encode())
        except InvalidTag as exc:
            raise CipherError(f"the stored body of {operation_id} failed authentication") from exc
