"""The `Idempotency-Key` header: from what clients send to the key we store.

The IETF draft defines the header as a Structured Field string (`"abc"`), but
most clients send the bare value (`abc`). Both must mean the same operation,
or a client that switches library mid-retry would create a second effect. So
one function turns the header into a single normalized key, and everything
downstream (store, lookup URLs, `forward_key`, probe paths) only ever sees
that key. Anything doubtful (two headers, a malformed quoted string, a key
outside printable ASCII) is refused with the rule it broke, never guessed at:
a guess that differs between two retries is a duplicate effect.

A value that starts with `"` must be a whole, valid Structured Field string.
Whitespace (space or tab) just inside its quotes is refused: HTTP strips a
field value's outer whitespace, so the forwarded `Idempotency-Key` (and a bare
retry) would lose it, and `"  pay-42 "` and `pay-42` would be two keys for
one effect. So no accepted key starts or ends with whitespace; spaces inside a
key (`"pay 42"`, or bare `pay 42`) are kept.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import quote

from gateway.engine.errors import InvalidKey

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["MAX_KEY_LENGTH", "format_key_header", "operation_url", "parse_idempotency_key"]

MAX_KEY_LENGTH = 255
"""The longest normalized key accepted, in characters (all ASCII, so also bytes)."""

# RFC 9110 optional whitespace around a field value.
_OWS = " \t"


def parse_idempotency_key(values: Sequence[str]) -> str | None:
    """Return the normalized key from every `Idempotency-Key` value received.

    An empty list means the header is absent (None); a malformed header raises
    `InvalidKey` whose detail names the rule it broke.

    >>> parse_idempotency_key(["run-77:0:c1"]), parse_idempotency_key(['"run-77:0:c1"'])
    ('run-77:0:c1', 'run-77:0:c1')
    >>> parse_idempotency_key([]) is None
    True
    """
    # A str is a Sequence[str] too; taking one for a list would parse only "r".
    if isinstance(values, str):
        raise TypeError("parse_idempotency_key takes the list of header values, not a str")
    if not values:
        return None
    if len(values) > 1:
        raise InvalidKey(
            f"the Idempotency-Key header was sent twice ({len(values)} values); send it once"
        )
    value = values[0].strip(_OWS)
    key = _parse_sf_string(value) if value.startswith('"') else value
    if not key:
        raise InvalidKey("the Idempotency-Key is empty; it must be 1 to 255 characters")
    if key.strip(_OWS) != key:
        # Only a quoted key can get here: a bare value's outer whitespace is gone.
        raise InvalidKey(
            "the quoted Idempotency-Key has whitespace just inside its quotes; HTTP strips "
            "a header value's outer whitespace on the way upstream, so two spellings would "
            "name one effect: send the key without it"
        )
    for position, char in enumerate(key):
        if not " " <= char <= "~":
            raise InvalidKey(
                f"the Idempotency-Key has a character outside printable ASCII "
                f"(%x20-7E) at position {position}: {char!r}"
            )
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidKey(
            f"the Idempotency-Key is {len(key)} characters long; "
            f"the limit is {MAX_KEY_LENGTH} (after unquoting)"
        )
    return key


def operation_url(key: str) -> str:
    """The lookup URL for a key, percent-encoded as one path segment.

    >>> operation_url("run-77:0/c1")
    '/operations/run-77%3A0%2Fc1'
    """
    return "/operations/" + quote(key, safe="")


def format_key_header(key: str) -> str:
    """Return a normalized key as it goes into a response's `Idempotency-Key` header.

    That is the bare key, as clients send it, unless the bare form would read
    back as another key: a key that starts with `"` is written as a Structured
    Field string, and parses back to the same key. A key with whitespace at
    either end (stored before such keys were refused) is quoted as well, so the
    header shows it exactly rather than as the shorter key HTTP would read.

    >>> format_key_header("run-77:0:c1")
    'run-77:0:c1'
    >>> format_key_header('"quoted"')
    '"\\\\"quoted\\\\""'
    """
    if key and not key.startswith('"') and key.strip(_OWS) == key:
        return key
    escaped = key.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def _parse_sf_string(value: str) -> str:
    """Unquote an RFC 8941 sf-string that starts at value[0] and fills all of value."""
    chars: list[str] = []
    position = 1
    while position < len(value):
        char = value[position]
        if char == "\\":
            escaped = value[position + 1 : position + 2]
            if escaped not in ('"', "\\"):
                shown = repr(escaped) if escaped else "the end of the value"
                raise InvalidKey(
                    f"the quoted Idempotency-Key has an invalid escape at position {position} "
                    f'(backslash followed by {shown}); only \\" and \\\\ are allowed'
                )
            chars.append(escaped)
            position += 2
        elif char == '"':
            if position != len(value) - 1:
                raise InvalidKey(
                    "the quoted Idempotency-Key has characters after its closing quote "
                    f"at position {position}"
                )
            return "".join(chars)
        elif " " <= char <= "~":
            chars.append(char)
            position += 1
        else:
            raise InvalidKey(
                f"the quoted Idempotency-Key has a character outside printable ASCII "
                f"(%x20-7E) at position {position}: {char!r}"
            )
    raise InvalidKey("the quoted Idempotency-Key has no closing quote")
