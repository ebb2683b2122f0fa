"""What a probe can see: its `applies_to` entries, and the request kinds calibration groups.

A probe's "not found" is the only machine verdict that releases a key, so it
counts only for requests the probe was declared for. A route often covers
more than its probe sees (the demo's tickets route also sends emails, which
its ticket lookup never finds): a "not found" about an email is no evidence
that the email was not sent.

An HTTP entry is `"METHOD /path"` in the upstream's terms: the path after
the route's prefix is taken off, the terms the probe's own `path` is written
in. It matches a request of that method whose path has the same segments,
one by one, where a `*` segment matches any one segment; never a prefix, never
a query. Paths are compared after percent-normalisation (escapes of
unreserved characters decoded, the others' hex upper-cased); a path with a
dot segment or an encoded slash is never covered, since two spellings of it
may name different resources upstream. An MCP entry is a tool name.

A request *kind* groups requests for calibration: the method and the path
with every segment that holds a digit replaced by `*` (ids and versions), or
on MCP routes the tool. Calibration asks the probe about a completed request
of the same kind before it believes a "not found" for that kind.

>>> entry = parse_entry("post /v1/issues/*/comments")
>>> entry.method, entry.segments
('POST', ('v1', 'issues', '*', 'comments'))
>>> http_kind("PATCH", "/v1/issues/T-17")
'PATCH /*/issues/*'
>>> covers(entry, "POST", "/v1/issues/T-17/comments"), covers(entry, "POST", "/v1/issues")
(True, False)
"""

from __future__ import annotations

import re
from typing import NamedTuple

__all__ = [
    "AppliesTo",
    "canonical_segments",
    "covers",
    "http_kind",
    "parse_entry",
    "upstream_path",
]

_METHOD_RE = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_ESCAPE_RE = re.compile(r"%([0-9A-Fa-f]{2})")
_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_DIGITS = frozenset("0123456789")


class AppliesTo(NamedTuple):
    """One parsed HTTP `applies_to` entry: a method and the path's segments (`*`: any one)."""

    text: str
    method: str
    segments: tuple[str, ...]


def _normalise_escapes(segment: str) -> str:
    def one(match: re.Match[str]) -> str:
        char = chr(int(match.group(1), 16))
        return char if char in _UNRESERVED else "%" + match.group(1).upper()

    return _ESCAPE_RE.sub(one, segment) if "%" in segment else segment


def canonical_segments(path: str) -> tuple[str, ...] | None:
    """The path's segments, percent-normalised; None when no entry may cover it (a dot
    segment or an encoded slash: two spellings of it may name different resources).

    >>> canonical_segments("/v1/%69ssues/a%2fb")
    >>> canonical_segments("/v1/%69ssues/%7e")
    ('v1', 'issues', '~')
    """
    segments = tuple(_normalise_escapes(part) for part in path.split("?", 1)[0].split("/")[1:])
    if any(part in (".", "..") or "%2F" in part or "%5C" in part for part in segments):
        return None
    return segments


def parse_entry(text: str) -> AppliesTo:
    """Parse `"METHOD /path"`; `ValueError` says what is wrong with it."""
    method, _, path = text.strip().partition(" ")
    path = path.strip()
    if not _METHOD_RE.fullmatch(method):
        raise ValueError(f'{text!r}: write "METHOD /path", e.g. "POST /v1/issues"')
    if not path.startswith("/") or any(char in path for char in "?# \t"):
        raise ValueError(f"{text!r}: the path must start with '/' and have no query or spaces")
    segments = canonical_segments(path)
    if segments is None:
        raise ValueError(f"{text!r}: dot segments and encoded slashes are never covered")
    if any("*" in part and part != "*" for part in segments):
        raise ValueError(f"{text!r}: '*' stands for one whole segment, never part of one")
    return AppliesTo(text=text, method=method.upper(), segments=segments)


def covers(entry: AppliesTo, method: str, path: str) -> bool:
    """Whether the entry covers a request of `method` on `path` (upstream terms)."""
    if method.upper() != entry.method:
        return False
    segments = canonical_segments(path)
    if segments is None or len(segments) != len(entry.segments):
        return False
    return all(want in ("*", got) for want, got in zip(entry.segments, segments, strict=True))


def upstream_path(prefix: str, path: str) -> str:
    """A gateway path in the upstream's terms: the route's prefix taken off.

    >>> upstream_path("/tickets", "/tickets/v1/issues"), upstream_path("/tickets", "/tickets")
    ('/v1/issues', '/')
    """
    rest = path[len(prefix) :] if path.startswith(prefix) else path
    return rest if rest.startswith("/") else "/" + rest


def http_kind(method: str, path: str) -> str:
    """The kind of an HTTP request (upstream terms): every segment holding a digit is `*`."""
    segments = canonical_segments(path)
    if segments is None:
        segments = tuple(path.split("?", 1)[0].split("/")[1:])
    shown = ("*" if _DIGITS.intersection(part) else part for part in segments)
    return f"{method.upper()} /{'/'.join(shown)}"
