r"""The fingerprint that binds an idempotency key to one request.

A key promises "this is the same request again". The gateway checks that
promise before it replays a receipt: a retry whose fingerprint differs from
the first attempt's gets 422 `key-mismatch` instead of someone else's stored
response (a reused key in an agent is a bug that must surface, not be papered
over). The fingerprint therefore covers exactly what decides the effect:

- the method: `POST` and `PATCH` on the same URL are different effects;
- the route name: the same path on two routes reaches two upstreams;
- the path and the query string: they name the resource and often carry
  parameters of the effect;
- the content type: it says how the body is read;
- the body: the effect itself.

Headers such as `Authorization`, `Date`, `User-Agent`, `Traceparent` or
`Content-Length` are left out on purpose: they legitimately change between two
honest retries of one call (a refreshed token, a new timestamp, a new trace
id, a new library version), and who may see a key is already decided by its
scope. Including them would turn every such retry into a 422.

Each part is length-prefixed, so no two different requests encode to the same
bytes: (`/a`, `b`) and (`/ab`, ``) as path and query hash differently.

There are two versions, and both stay:

- Version 2 (`fingerprint_request`, `v2:sha256:<hex>`) compares what a request
  *means*. Agents (language models) re-serialise their arguments on every
  attempt, so two honest attempts of one call differ in bytes: member order,
  whitespace, `1.0` against `1`, `"\u0062"` against `"b"`, `; charset=utf-8`,
  query parameter order, `%61` against `a`. A JSON body (`application/json`
  or any `+json` type) is hashed as its RFC 8785 canonical form
  (`canonical_json`), the query as `canonical_query`, the path as
  `canonical_path`. Anything that changes meaning still changes the
  fingerprint: a value, a type (`1` against `"1"`), an array's order, the
  order of repeated query parameters, a reserved character against its
  escape (`/` against `%2F`). A body that is not strictly valid JSON
  (duplicate member names, a lone surrogate, `NaN`, a BOM, nesting deeper than
  64, ...) has no single meaning to compare, so it is hashed as bytes, as in
  version 1: a retry must then repeat it byte for byte.
- Version 1 (`legacy_fingerprint_request`, `sha256:<hex>`) hashes the path,
  the raw query and the body bytes exactly as received, and the content type
  normalized (`normalize_content_type`). Its output never changes: operations
  recorded before the upgrade stored a version-1 fingerprint, and a retry of
  one of them is compared the old way, by computing version 1 again. The
  prefix of a stored fingerprint says which version to compute.

The two versions hash different leading tags (`FINGERPRINT_VERSION`,
`FINGERPRINT_V2_VERSION`) and carry different prefixes, so they can never be
taken for one another.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from typing import Any, NoReturn

import rfc8785

__all__ = [
    "FINGERPRINT_V2_PREFIX",
    "FINGERPRINT_V2_VERSION",
    "FINGERPRINT_VERSION",
    "MAX_JSON_DEPTH",
    "canonical_json",
    "canonical_path",
    "canonical_query",
    "fingerprint_request",
    "fingerprints",
    "is_json_media_type",
    "legacy_fingerprint_request",
    "normalize_content_type",
]

FINGERPRINT_VERSION = b"idempotency-gateway/fingerprint/v1"
"""Hashed first by version 1, so that a later encoding can never collide with it."""

FINGERPRINT_V2_VERSION = b"idempotency-gateway/fingerprint/v2"
"""Hashed first by version 2, so that it can never collide with version 1."""

FINGERPRINT_V2_PREFIX = "v2:sha256:"
"""What a version-2 fingerprint starts with (version 1's start with `sha256:`)."""

MAX_JSON_DEPTH = 64
"""Arrays and objects nested deeper than this make a body "bytes", not JSON: a
canonical form must not cost unbounded recursion on a hostile body."""


def fingerprint_request(
    *,
    method: str,
    route: str,
    path: str,
    query: str,
    content_type: str | None,
    body: bytes,
) -> str:
    """Return `v2:sha256:<hex>`: the version-2 fingerprint, which compares meaning.

    Two re-serialisations of one JSON request share it:

    >>> a = fingerprint_request(method="post", route="tickets", path="/tickets/v1/issues",
    ...                         query="b=2&a=1", content_type="application/json",
    ...                         body=b'{"title": "x", "priority": 1.0}')
    >>> b = fingerprint_request(method="POST", route="tickets", path="/tickets/v1/issues",
    ...                         query="a=1&b=2", content_type="Application/JSON; charset=utf-8",
    ...                         body=b'{"priority":1,"title":"x"}')
    >>> a == b, a.startswith(FINGERPRINT_V2_PREFIX), len(a)
    (True, True, 74)

    The body part is marked "json" or "bytes", so a JSON body and a byte body
    never encode alike, even when their bytes are the same:

    >>> c = fingerprint_request(method="POST", route="tickets", path="/tickets/v1/issues",
    ...                         query="a=1&b=2", content_type="text/plain",
    ...                         body=b'{"priority":1,"title":"x"}')
    >>> b == c
    False
    """
    parts: tuple[bytes, ...] = (
        FINGERPRINT_V2_VERSION,
        _encode(method.upper()),
        _encode(route),
        _encode(canonical_path(path)),
        _encode(canonical_query(query)),
    )
    canonical = canonical_json(body) if is_json_media_type(content_type) else None
    if canonical is not None:
        assert content_type is not None  # is_json_media_type(None) is False
        parts += (b"json", _encode(_media_type(content_type)), canonical)
    else:
        parts += (b"bytes", _encode(normalize_content_type(content_type)), bytes(body))
    return FINGERPRINT_V2_PREFIX + _digest(parts)


def legacy_fingerprint_request(
    *,
    method: str,
    route: str,
    path: str,
    query: str,
    content_type: str | None,
    body: bytes,
) -> str:
    """Return `sha256:<hex>`: the version-1 fingerprint, over the bytes as received.

    Kept bit for bit: fingerprints stored before version 2 are compared with it.

    >>> a = legacy_fingerprint_request(method="post", route="tickets", path="/tickets/v1/issues",
    ...                                query="", content_type="application/json", body=b"{}")
    >>> b = legacy_fingerprint_request(method="POST", route="tickets", path="/tickets/v1/issues",
    ...                                query="", content_type="Application/JSON", body=b"{}")
    >>> a == b, a.startswith("sha256:"), len(a)
    (True, True, 71)
    """
    parts = (
        FINGERPRINT_VERSION,
        _encode(method.upper()),
        _encode(route),
        _encode(path),
        _encode(query),
        _encode(normalize_content_type(content_type)),
        bytes(body),
    )
    return "sha256:" + _digest(parts)


def fingerprints(
    method: str,
    route: str,
    path: str,
    query: str,
    content_type: str | None,
    body: bytes,
    canonical: bool = True,
) -> tuple[str, str | None]:
    """(the fingerprint a new key is bound with, the old form a stored one may have):
    (version 2, version 1); with `canonical` false (a benchmark's "off" side) version 1
    alone, as before version 2. Positional, so it can run in a helper process.

    >>> new, old = fingerprints("POST", "t", "/t/x", "", "application/json", b"{}")
    >>> new.startswith(FINGERPRINT_V2_PREFIX), old.startswith("sha256:")
    (True, True)
    """
    legacy = legacy_fingerprint_request(
        method=method, route=route, path=path, query=query, content_type=content_type, body=body
    )
    if not canonical:
        return legacy, None
    current = fingerprint_request(
        method=method, route=route, path=path, query=query, content_type=content_type, body=body
    )
    return current, legacy


def _digest(parts: tuple[bytes, ...]) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()


def normalize_content_type(content_type: str | None) -> str:
    """Return a canonical spelling of a Content-Type value ("" when there is none).

    The media type and parameter names are lower-cased (case-insensitive by
    RFC 9110), as is the `charset` value; other parameter values keep their
    case (a multipart `boundary` is case-sensitive). Whitespace around `;` and
    `=` goes, and a quoted value that needs no quotes loses them.

    >>> normalize_content_type('Text/Plain ; Charset = "UTF-8"')
    'text/plain;charset=utf-8'
    >>> normalize_content_type(None), normalize_content_type("")
    ('', '')
    """
    if not content_type:
        return ""
    media_type, _, rest = content_type.partition(";")
    parts = [media_type.strip(" \t").lower()]
    for name, value in _parameters(rest):
        if name == "charset":
            value = value.lower()
        parts.append(f"{name}={_quote_if_needed(value)}")
    return ";".join(parts)


def is_json_media_type(content_type: str | None) -> bool:
    """Whether a Content-Type says JSON: `application/json` or any `<type>/<subtype>+json`.

    Case and parameters do not matter. A JSON text is always UTF-8 (RFC 8259),
    so a `charset` parameter cannot change how the body reads.

    >>> is_json_media_type("Application/JSON; charset=UTF-8")
    True
    >>> is_json_media_type("application/problem+json"), is_json_media_type(" application/ld+json ")
    (True, True)
    >>> is_json_media_type("text/plain"), is_json_media_type("application/+json")
    (False, False)
    >>> is_json_media_type(None), is_json_media_type("application/jsonx")
    (False, False)
    """
    if not content_type:
        return False
    media_type = _media_type(content_type)
    if media_type == "application/json":
        return True
    type_, slash, subtype = media_type.partition("/")
    return bool(
        slash
        and subtype.endswith("+json")
        and _is_token(type_)
        and _is_token(subtype.removesuffix("+json"))
    )


def _media_type(content_type: str) -> str:
    return content_type.partition(";")[0].strip(" \t").lower()


def _is_token(text: str) -> bool:
    return bool(text) and all(char in _TCHARS for char in text)


# --- JSON ------------------------------------------------------------------


def canonical_json(body: bytes) -> bytes | None:
    r"""Return the RFC 8785 (JCS) canonical form of a JSON text, or None to hash it as bytes.

    Two JSON texts with one meaning have one canonical form: members sorted
    by name (UTF-16 code units), no insignificant whitespace, strings and
    numbers each in one spelling.

    >>> canonical_json(b'{"b": [1.0, 1e0, 10e-1, -0], "a": "\\u0062\\/"}')
    b'{"a":"b/","b":[1,1,1,0]}'

    A number is compared as the IEEE double it reads as when that double
    stands for its value exactly: an integer within 2**53, or at most 15
    significant digits that survive the round trip. Any other number (an id
    of 20 digits, a 30-digit decimal) would lose digits as a double and two
    different values would look alike, so it is compared by its exact
    decimal value, written out in full:

    >>> canonical_json(b'[12345678901234567890, 1.234567890123456789e19, 1e400, 1E+21]')
    b'[12345678901234567890,12345678901234567890,1e+400,1e+21]'

    None for anything that is not strict UTF-8 JSON with one meaning: invalid
    JSON, a BOM or another encoding, `NaN` or `Infinity`, a member name twice
    in one object, a lone surrogate, nesting deeper than `MAX_JSON_DEPTH`.
    It never raises.

    >>> [canonical_json(b) for b in (b'{"a": 1, "a": 2}', b'"\\ud800"', b'[1,]', b'NaN')]
    [None, None, None, None]
    """
    try:
        text = body.decode("utf-8")
        if text.startswith("\ufeff"):
            return None
        value = _DECODER.decode(text)
        out: list[bytes] = []
        _dump(value, out, 0)
        return b"".join(out)
    except (ValueError, ArithmeticError, RecursionError):
        # ValueError covers invalid JSON, invalid UTF-8, a lone surrogate (no
        # UTF-8 or UTF-16 form), duplicates, depth and Python's int digit limit;
        # RecursionError a nesting deep enough to exhaust the parser's stack.
        return None


class _NotCanonical(ValueError):
    """A JSON text whose meaning is not one value (duplicate names, a constant, depth)."""


class _ExactNumber:
    """A number compared by its exact decimal value: a double would lose digits."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    members = dict(pairs)
    if len(members) != len(pairs):
        raise _NotCanonical("a member name appears twice in one object")
    return members


def _constant(name: str) -> NoReturn:
    raise _NotCanonical(f"{name} is not JSON")


def _int(token: str) -> int | float | _ExactNumber:
    # Up to 15 digits: below 10**15 < 2**53, a double holds it exactly.
    if len(token) <= 15 or (len(token) == 16 and token[0] == "-"):
        return int(token)
    return _number(token)


def _float(token: str) -> int | float | _ExactNumber:
    # A token of at most 16 characters has a "." or an "e", so at most 15 digits,
    # and any such decimal in the normal range is its double's shortest spelling.
    if len(token) <= 16:
        number = float(token)
        if _MIN_NORMAL <= abs(number) <= _MAX_DOUBLE:
            return number
    return _number(token)


_MIN_NORMAL = 2.2250738585072014e-308
_MAX_DOUBLE = 1.7976931348623157e308
_MAX_SAFE = 2**53
_MAX_DOUBLE_DIGITS = 15


def _number(token: str) -> int | float | _ExactNumber:
    """The value of a JSON number token: a double when that is exact, else exact text.

    The path is chosen from the value (sign, significant digits, exponent),
    never from the spelling, so one value always takes one path.
    """
    negative, digits, exponent = _decompose(token)
    if not digits:
        return 0  # -0 and 0 are one value (RFC 8785 writes 0)
    count = len(digits)
    if exponent >= 0 and count + exponent <= 16:
        integer = int(digits) * 10**exponent
        if integer <= _MAX_SAFE:
            # rfc8785 refuses ints past 2**53 - 1: 2**53 itself goes as a double.
            integer = -integer if negative else integer
            return integer if abs(integer) < _MAX_SAFE else float(integer)
    if count <= _MAX_DOUBLE_DIGITS:
        number = float(token)
        # Overflow to inf or underflow to 0 loses the value; a subnormal keeps
        # fewer digits, so it must spell back to the same value.
        exact = _MIN_NORMAL <= abs(number) <= _MAX_DOUBLE or (
            math.isfinite(number)
            and number != 0
            and _decompose(repr(number)) == (negative, digits, exponent)
        )
        if exact:
            return number
    return _ExactNumber(_exact_text(negative, digits, exponent))


def _decompose(token: str) -> tuple[bool, str, int]:
    """(negative, significant digits without leading or trailing zeros, exponent).

    The value is `(-1 if negative) * int(digits) * 10**exponent`; zero has no digits.

    >>> _decompose("-1.2300e-5"), _decompose("1000"), _decompose("0.0")
    ((True, '123', -7), (False, '1', 3), (False, '', 0))
    """
    negative = token.startswith("-")
    mantissa, _, exponent_text = token.removeprefix("-").lower().partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = (whole + fraction).lstrip("0")
    if not digits:
        return False, "", 0
    significant = digits.rstrip("0")
    exponent = (int(exponent_text) if exponent_text else 0) - len(fraction)
    return negative, significant, exponent + len(digits) - len(significant)


def _exact_text(negative: bool, digits: str, exponent: int) -> str:
    """An exact value written as ECMAScript would write it with unlimited digits.

    The layout is `Number.prototype.toString`'s (plain up to 21 integer digits,
    `0.000001` down to 1e-6, else `d.ddde+n`), but no digit is dropped. Every
    output of either path stands for exactly its input's value, so texts of
    the two paths can only be equal for equal values, which take one path.

    >>> _exact_text(False, "12345678901234567891", 0), _exact_text(True, "1", 400)
    ('12345678901234567891', '-1e+400')
    >>> _exact_text(False, "1000000000000000000001", -40)
    '1.000000000000000000001e-19'
    """
    count = len(digits)
    point = count + exponent  # the value is 0.<digits> * 10**point
    if count <= point <= 21:
        text = digits + "0" * (point - count)
    elif 0 < point <= 21:
        text = digits[:point] + "." + digits[point:]
    elif -6 < point <= 0:
        text = "0." + "0" * -point + digits
    else:
        power = point - 1
        mantissa = digits[0] + ("." + digits[1:] if count > 1 else "")
        text = f"{mantissa}e{'+' if power >= 0 else '-'}{abs(power)}"
    return "-" + text if negative else text


_DECODER = json.JSONDecoder(
    object_pairs_hook=_object,
    parse_int=_int,
    parse_float=_float,
    parse_constant=_constant,
)
"""One decoder for all calls: `json.loads` with hooks would build one a call."""


def _dump(value: object, out: list[bytes], depth: int) -> None:
    """Append the canonical form of `value`: the structure is written here, strings
    and doubles as `rfc8785` writes them (its own code for anything not trivial)."""
    if isinstance(value, str):
        out.append(_string(value))
    elif isinstance(value, dict):
        if depth >= MAX_JSON_DEPTH:
            raise _NotCanonical("nested too deep")
        names = list(value)
        if all(map(str.isascii, names)):
            names.sort()  # in ASCII, code points are UTF-16 code units
        else:
            names.sort(key=_utf16)  # raises on a lone surrogate
        separator = b"{"
        for name in names:
            member = value[name]
            out += (separator, _string(name), b":")
            separator = b","
            if type(member) is str:  # the common case, without a call
                out.append(_string(member))
            else:
                _dump(member, out, depth + 1)
        out.append(b"}" if names else b"{}")
    elif isinstance(value, list):
        if depth >= MAX_JSON_DEPTH:
            raise _NotCanonical("nested too deep")
        separator = b"["
        for item in value:
            out.append(separator)
            separator = b","
            if type(item) is str:
                out.append(_string(item))
            else:
                _dump(item, out, depth + 1)
        out.append(b"]" if value else b"[]")
    elif value is None:
        out.append(b"null")
    elif value is True:
        out.append(b"true")
    elif value is False:
        out.append(b"false")
    elif isinstance(value, int):
        out.append(str(value).encode())  # within 2**53 (`_number`): all digits, as ECMAScript
    elif isinstance(value, float):
        out.append(_double(value))
    else:
        assert isinstance(value, _ExactNumber)
        out.append(value.text.encode("ascii"))


_NEEDS_ESCAPE = re.compile(r'[\x00-\x1f"\\]')
"""What RFC 8785 escapes in a string (rfc8785's own pattern); all else is UTF-8 as is."""


def _string(text: str) -> bytes:
    if _NEEDS_ESCAPE.search(text) is None:
        # Raises UnicodeEncodeError (a ValueError) on a lone surrogate, as rfc8785 does.
        return b'"' + text.encode("utf-8") + b'"'
    return rfc8785.dumps(text)


def _double(number: float) -> bytes:
    # rfc8785 writes str(number) minus a ".0" when it has no exponent (any double
    # from 1e-4 to 1e16); the exponent forms, the ECMAScript part, are left to it.
    text = repr(number)
    if "e" in text or number == 0:
        return rfc8785.dumps(number)
    return text.removesuffix(".0").encode()


def _utf16(name: str) -> bytes:
    return name.encode("utf-16-be")


# --- path and query ------------------------------------------------------------


def canonical_query(raw_query: str) -> str:
    """Return the query with equivalent spellings made one, and parameters sorted by name.

    Escapes of unreserved characters are decoded and other escapes upper-cased
    (`canonical_path`); `+` is kept as it is (a space to a form parser, a plus
    to others). Parameters are sorted stably by name only, so the order of
    distinct names does not matter but repeated names keep their relative
    order: many servers read `a=1&a=2` as the list `[1, 2]`.

    >>> canonical_query("b=2&%61=1&a=%2f&c")
    'a=1&a=%2F&b=2&c'
    >>> canonical_query("a=2&a=1"), canonical_query("")
    ('a=2&a=1', '')
    """
    if not raw_query:
        return raw_query
    components = [_normalize_escapes(component) for component in raw_query.split("&")]
    components.sort(key=_parameter_name)
    return "&".join(components)


def _parameter_name(component: str) -> str:
    return component.partition("=")[0]


def canonical_path(raw_path: str) -> str:
    """Return the path with escapes of unreserved characters decoded and the others upper-cased.

    RFC 3986 (section 6.2.2) makes `%61` and `a`, and `%2f` and `%2F`, the
    same; `%2F` and `/` are not (one is data, the other a separator), and
    neither are different cases of letters or a `..` segment: nothing else
    changes.

    >>> canonical_path("/t/%7Euser/%61%2fb/%e2%82%ac/./x")
    '/t/~user/a%2Fb/%E2%82%AC/./x'
    >>> canonical_path("/%zz/%")
    '/%zz/%'
    """
    return _normalize_escapes(raw_path)


_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")
_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}")
_BARE_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")
_ESCAPES = {
    f"%{high}{low}": (
        chr(int(high + low, 16))
        if chr(int(high + low, 16)) in _UNRESERVED
        else f"%{high}{low}".upper()
    )
    for high in "0123456789abcdefABCDEF"
    for low in "0123456789abcdefABCDEF"
}
"""Every spelling of an escape to its canonical form: decoded or upper-cased."""


def _normalize_escapes(text: str) -> str:
    """Decode escapes of unreserved characters, upper-case the others.

    A malformed escape (`%zz`, a trailing `%`) is left as it is. One subtlety
    keeps this idempotent: decoding `%34` right after a bare `%` would make
    `%%341` into `%41`, a new escape that a second pass would read as `A`. So
    an escape that decodes to a hex digit right after a bare `%` (or a bare
    `%` and one hex digit) stays an escape, upper-cased.

    >>> _normalize_escapes("%%341"), _normalize_escapes("%a%31b"), _normalize_escapes("%%2d")
    ('%%341', '%a%31b', '%-')
    """
    if "%" not in text:
        return text
    if _BARE_PERCENT.search(text) is None:
        return _ESCAPE.sub(_escape, text)
    out: list[str] = []
    after_bare = -1  # characters since a bare "%" that could still start an escape
    i, n = 0, len(text)
    while i < n:
        char = text[i]
        if char == "%" and _ESCAPE.match(text, i):
            canonical = _ESCAPES[text[i : i + 3]]
            if after_bare >= 0 and canonical in _HEX_DIGITS:
                canonical = text[i : i + 3].upper()
            out.append(canonical)
            after_bare = -1
            i += 3
            continue
        if char == "%":
            after_bare = 0
        elif after_bare == 0 and char in _HEX_DIGITS:
            after_bare = 1
        else:
            after_bare = -1
        out.append(char)
        i += 1
    return "".join(out)


def _escape(match: re.Match[str]) -> str:
    return _ESCAPES[match.group()]


# --- content type --------------------------------------------------------------

_TCHARS = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def _encode(text: str) -> bytes:
    # surrogateescape keeps undecodable request bytes distinct instead of failing.
    return text.encode("utf-8", "surrogateescape")


def _parameters(text: str) -> list[tuple[str, str]]:
    """Split `; a=b; c="d;e"` into (lower-cased name, unquoted value) pairs."""
    params: list[tuple[str, str]] = []
    i, n = 0, len(text)
    while i < n:
        end = i
        while end < n and text[end] not in "=;":
            end += 1
        name = text[i:end].strip(" \t").lower()
        value = ""
        i = end
        if i < n and text[i] == "=":
            i += 1
            while i < n and text[i] in " \t":
                i += 1
            if i < n and text[i] == '"':
                chars: list[str] = []
                i += 1
                while i < n and text[i] != '"':
                    if text[i] == "\\" and i + 1 < n:
                        i += 1
                    chars.append(text[i])
                    i += 1
                value = "".join(chars)
                i += 1
                while i < n and text[i] != ";":
                    i += 1
            else:
                end = i
                while end < n and text[end] != ";":
                    end += 1
                value = text[i:end].strip(" \t")
                i = end
        if name or value:
            params.append((name, value))
        i += 1
    return params


def _quote_if_needed(value: str) -> str:
    if value and all(char in _TCHARS for char in value):
        return value
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'
