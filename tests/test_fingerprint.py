"""Request fingerprints: deterministic, sensitive to every part, unambiguous."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.engine.fingerprint import fingerprint_request, normalize_content_type

BASE: dict[str, Any] = {
    "method": "POST",
    "route": "tickets",
    "path": "/tickets/v1/issues",
    "query": "a=1",
    "content_type": "application/json",
    "body": b'{"title": "x"}',
}

texts = st.text(max_size=40)
requests = st.fixed_dictionaries(
    {
        "method": st.sampled_from(["POST", "PATCH", "PUT", "DELETE"]),
        "route": texts,
        "path": texts,
        "query": texts,
        "content_type": st.none() | st.sampled_from(["application/json", "text/plain"]),
        "body": st.binary(max_size=64),
    }
)


def test_fingerprint_shape_and_determinism() -> None:
    """The same request always gives the same `sha256:<64 hex>` fingerprint."""
    first = fingerprint_request(**BASE)
    assert first == fingerprint_request(**dict(BASE))
    assert first.startswith("sha256:")
    assert len(first) == len("sha256:") + 64
    int(first.removeprefix("sha256:"), 16)


@given(
    requests,
    st.sampled_from(["method", "route", "path", "query", "content_type", "body"]),
    st.data(),
)
def test_every_part_changes_the_fingerprint(
    request: dict[str, Any], part: str, data: st.DataObject
) -> None:
    """Changing any one part of a request (to a non-equivalent value) changes its fingerprint."""
    other = dict(request)
    if part == "method":
        other["method"] = data.draw(st.sampled_from(["GET", "OPTIONS"]))
    elif part == "content_type":
        other["content_type"] = "application/xml"
    elif part == "body":
        other["body"] = request["body"] + data.draw(st.binary(min_size=1, max_size=4))
    else:
        other[part] = request[part] + data.draw(st.text(min_size=1, max_size=4))
    assert fingerprint_request(**request) != fingerprint_request(**other)


def test_method_case_does_not_matter() -> None:
    """The method is compared upper-cased."""
    assert fingerprint_request(**{**BASE, "method": "post"}) == fingerprint_request(**BASE)


@pytest.mark.parametrize(
    ("left", "right"),
    [
        ({"path": "/a", "query": "b"}, {"path": "/ab", "query": ""}),
        ({"path": "/a", "query": ""}, {"path": "", "query": "/a"}),
        ({"route": "t", "path": "/x"}, {"route": "t/x", "path": ""}),
        ({"query": "a", "content_type": None}, {"query": "", "content_type": "a"}),
        (
            {"content_type": "text/plain", "body": b""},
            {"content_type": None, "body": b"text/plain"},
        ),
        ({"method": "POST", "route": "x"}, {"method": "POSTX", "route": ""}),
    ],
)
def test_no_ambiguity_between_parts(left: dict[str, Any], right: dict[str, Any]) -> None:
    """Moving bytes from one part to its neighbour never gives the same fingerprint."""
    assert fingerprint_request(**{**BASE, **left}) != fingerprint_request(**{**BASE, **right})


@pytest.mark.parametrize(
    ("raw", "normal"),
    [
        (None, ""),
        ("", ""),
        ("application/json", "application/json"),
        ("Application/JSON", "application/json"),
        ("application/json; charset=UTF-8", "application/json;charset=utf-8"),
        ("application/json ;charset = utf-8", "application/json;charset=utf-8"),
        ('application/json; charset="utf-8"', "application/json;charset=utf-8"),
        ("text/plain;", "text/plain"),
        ("multipart/form-data; Boundary=AbC", "multipart/form-data;boundary=AbC"),
        ('text/plain; x="a;b"', 'text/plain;x="a;b"'),
        (
            "text/plain; format=flowed; charset=US-ASCII",
            "text/plain;format=flowed;charset=us-ascii",
        ),
    ],
)
def test_content_type_normalization(raw: str | None, normal: str) -> None:
    """Equivalent spellings of a Content-Type normalize to one canonical string."""
    assert normalize_content_type(raw) == normal


def test_equivalent_content_types_share_a_fingerprint() -> None:
    """Retries whose client library spells the content type differently still match."""
    spellings = [None, ""]
    assert len({fingerprint_request(**{**BASE, "content_type": ct}) for ct in spellings}) == 1
    spellings2 = ["application/json; charset=utf-8", "Application/Json ; Charset=UTF-8"]
    assert len({fingerprint_request(**{**BASE, "content_type": ct}) for ct in spellings2}) == 1


def test_boundary_case_is_significant() -> None:
    """A multipart boundary keeps its case: it is case-sensitive."""
    a = fingerprint_request(**{**BASE, "content_type": "multipart/form-data; boundary=AB"})
    b = fingerprint_request(**{**BASE, "content_type": "multipart/form-data; boundary=ab"})
    assert a != b
