"""RFC 6901 JSON pointers, as a config value and as a lookup.

An MCP route's probe judges a tool's answer by one value inside its
`structuredContent`, named by a pointer in the config (`applied_pointer =
"/found"`). A pointer that cannot be read (`found` without its slash, `~2`)
would only ever find nothing, and every probe would leave its operation
`unknown` without saying why; so the syntax is checked at start, and the
lookup here reads exactly what the check accepted.
"""

from __future__ import annotations

import re
from typing import Any, Final

__all__ = ["MISSING", "parse_pointer", "resolve_pointer"]

MISSING: Final = object()
"""What `resolve_pointer` answers when the document has no value at the pointer."""

_ARRAY_INDEX = re.compile(r"0|[1-9][0-9]*")


def parse_pointer(pointer: str) -> tuple[str, ...]:
    """The reference tokens of `pointer`, unescaped; `ValueError` for a malformed one.

    >>> parse_pointer("/found"), parse_pointer("/a~1b/~0c/0")
    (('found',), ('a/b', '~c', '0'))
    >>> parse_pointer("found")
    Traceback (most recent call last):
    ...
    ValueError: a JSON pointer starts with '/' (RFC 6901), got 'found'
    """
    if pointer == "":
        return ()
    if not pointer.startswith("/"):
        raise ValueError(f"a JSON pointer starts with '/' (RFC 6901), got {pointer!r}")
    if re.search(r"~(?![01])", pointer):
        raise ValueError(f"'~' must be followed by 0 or 1 in a JSON pointer, got {pointer!r}")
    return tuple(token.replace("~1", "/").replace("~0", "~") for token in pointer[1:].split("/"))


def resolve_pointer(document: Any, pointer: str) -> Any:
    """The value at `pointer` in `document`, or `MISSING` when there is none.

    An array is indexed only by a decimal index without leading zeros (`-`,
    the element after the last, never exists).

    >>> resolve_pointer({"found": True, "items": [{"a": 1}]}, "/items/0/a")
    1
    >>> resolve_pointer({"items": []}, "/items/00") is MISSING
    True
    """
    value = document
    for token in parse_pointer(pointer):
        if isinstance(value, dict):
            if token not in value:
                return MISSING
            value = value[token]
        elif isinstance(value, list) and _ARRAY_INDEX.fullmatch(token):
            index = int(token)
            if index >= len(value):
                return MISSING
            value = value[index]
        else:
            return MISSING
    return value
