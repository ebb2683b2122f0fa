"""Request fingerprints: deterministic, sensitive to every part, unambiguous.

Version 1 (`legacy_fingerprint_request`) hashes bytes as received and must never
change: stored fingerprints are compared with it. Version 2 (`fingerprint_request`)
compares meaning: honest re-serialisations of one request share it, any change of
meaning changes it, and a body that is not strict JSON is compared as bytes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st
from suite_profile import examples

from gateway.engine.fingerprint import (
    FINGERPRINT_V2_PREFIX,
    MAX_JSON_DEPTH,
    canonical_json,
    canonical_path,
    canonical_query,
    fingerprint_request,
    is_json_media_type,
    legacy_fingerprint_request,
    normalize_content_type,
)

Fingerprint = Callable[..., str]

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


def v2(**overrides: Any) -> str:
    return fingerprint_request(**{**BASE, **overrides})


# --- version 1: pinned bit for bit ---------------------------------------------


def test_legacy_fingerprint_is_pinned() -> None:
    """Version 1's output is the digest computed before version 2 existed, bit for bit."""
    assert (
        legacy_fingerprint_request(**{**BASE, "content_type": "application/json; charset=UTF-8"})
        == "sha256:c1c4b7e176ee52e9fa390a28bd4281d3cdef3b07544e735cb25394ecc8a931bb"
    )
    assert (
        legacy_fingerprint_request(**{**BASE, "query": "", "content_type": None, "body": b""})
        == "sha256:a7375825abfb1f5a5220bd8b12fe4ad7fec8a9d80ff6385cbc922d152c265046"
    )


def test_legacy_fingerprint_compares_bytes() -> None:
    """Version 1 keeps telling re-serialisations apart: it hashes bytes as received."""
    assert legacy_fingerprint_request(**BASE) != legacy_fingerprint_request(
        **{**BASE, "body": b'{"title":"x"}'}
    )
    assert legacy_fingerprint_request(**{**BASE, "query": "a=1&b=2"}) != (
        legacy_fingerprint_request(**{**BASE, "query": "b=2&a=1"})
    )


def test_fingerprint_shape_and_determinism() -> None:
    """The same request always gives the same `sha256:<64 hex>` fingerprint."""
    first = legacy_fingerprint_request(**BASE)
    assert first == legacy_fingerprint_request(**dict(BASE))
    assert first.startswith("sha256:")
    assert len(first) == len("sha256:") + 64
    int(first.removeprefix("sha256:"), 16)


@given(
    requests,
    st.sampled_from(["method", "route", "path", "query", "content_type", "body"]),
    st.data(),
)
@settings(max_examples=examples(60))
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
    assert legacy_fingerprint_request(**request) != legacy_fingerprint_request(**other)


@pytest.mark.parametrize("fingerprint", [legacy_fingerprint_request, fingerprint_request])
def test_method_case_does_not_matter(fingerprint: Fingerprint) -> None:
    """The method is compared upper-cased."""
    assert fingerprint(**{**BASE, "method": "post"}) == fingerprint(**BASE)


@pytest.mark.parametrize("fingerprint", [legacy_fingerprint_request, fingerprint_request])
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
def test_no_ambiguity_between_parts(
    fingerprint: Fingerprint, left: dict[str, Any], right: dict[str, Any]
) -> None:
    """Moving bytes from one part to its neighbour never gives the same fingerprint."""
    assert fingerprint(**{**BASE, **left}) != fingerprint(**{**BASE, **right})


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
    assert (
        len({legacy_fingerprint_request(**{**BASE, "content_type": ct}) for ct in spellings}) == 1
    )
    spellings2 = ["application/json; charset=utf-8", "Application/Json ; Charset=UTF-8"]
    assert (
        len({legacy_fingerprint_request(**{**BASE, "content_type": ct}) for ct in spellings2}) == 1
    )


@pytest.mark.parametrize("fingerprint", [legacy_fingerprint_request, fingerprint_request])
def test_boundary_case_is_significant(fingerprint: Fingerprint) -> None:
    """A multipart boundary keeps its case: it is case-sensitive."""
    a = fingerprint(**{**BASE, "content_type": "multipart/form-data; boundary=AB"})
    b = fingerprint(**{**BASE, "content_type": "multipart/form-data; boundary=ab"})
    assert a != b


# --- version 2: one fingerprint for one meaning ---------------------------------


def test_v2_shape_and_version_tag() -> None:
    """Version 2 is `v2:sha256:<64 hex>`, never equal to version 1 of the same request."""
    first = fingerprint_request(**BASE)
    assert first == fingerprint_request(**dict(BASE))
    assert first.startswith(FINGERPRINT_V2_PREFIX)
    int(first.removeprefix(FINGERPRINT_V2_PREFIX), 16)
    assert len(first) == len(FINGERPRINT_V2_PREFIX) + 64
    assert first.removeprefix("v2:") != legacy_fingerprint_request(**BASE)


@pytest.mark.parametrize(
    ("left", "right"),
    [
        pytest.param(
            {"body": b'{"a": 1, "b": [true, null]}'},
            {"body": b'{"b":[true,null],"a":1}'},
            id="member-order-and-whitespace",
        ),
        pytest.param(
            {"body": b'{\n  "a" : 1 ,\r\n\t"b" : 2\n}\n'},
            {"body": b'{"a":1,"b":2}'},
            id="all-json-whitespace",
        ),
        pytest.param({"body": b"[1, 1.0, 1e0, 10e-1]"}, {"body": b"[1,1,1,1]"}, id="one"),
        pytest.param({"body": b"[100, 1E2, 1.00e+2]"}, {"body": b"[1e2,100,100]"}, id="hundred"),
        pytest.param({"body": b"[-0, 0.0, -0e5]"}, {"body": b"[0,0,0]"}, id="zero"),
        pytest.param({"body": b'{"a": "\\u0062"}'}, {"body": b'{"a": "b"}'}, id="unicode-escape"),
        pytest.param({"body": b'{"a": "\\/"}'}, {"body": b'{"a": "/"}'}, id="solidus-escape"),
        pytest.param(
            {"body": b'{"a": "\\u00e9\\ud83d\\ude00"}'},
            {"body": '{"a": "é😀"}'.encode()},
            id="non-ascii-escapes",
        ),
        pytest.param({"body": b'{"\\u0061": 1}'}, {"body": b'{"a": 1}'}, id="escaped-member-name"),
        pytest.param(
            {"body": b"[12345678901234567890, 1.0e16, 0.10]"},
            {"body": b"[12345678901234567890.0, 10000000000000000, 1e-1]"},
            id="same-value-numbers",
        ),
        pytest.param(
            {"body": b"1.234567890123456789e19"},
            {"body": b"12345678901234567890"},
            id="big-number-spellings",
        ),
        pytest.param(
            {"content_type": "application/json"},
            {"content_type": "application/json; charset=utf-8"},
            id="charset",
        ),
        pytest.param(
            {"content_type": "application/json"},
            {"content_type": "Application/JSON"},
            id="media-type-case",
        ),
        pytest.param(
            {"content_type": "application/merge-patch+json", "body": b'{"a": 1, "b": 2}'},
            {
                "content_type": "Application/Merge-Patch+JSON;charset=utf-8",
                "body": b'{"b":2,"a":1}',
            },
            id="plus-json",
        ),
        pytest.param({"query": "b=2&a=1"}, {"query": "a=1&b=2"}, id="query-order"),
        pytest.param({"query": "%61=1"}, {"query": "a=1"}, id="query-unreserved-escape"),
        pytest.param({"query": "a=%7e%2d"}, {"query": "a=~-"}, id="query-unreserved-symbols"),
        pytest.param(
            {"path": "/tickets/v1/%69ssues"}, {"path": "/tickets/v1/issues"}, id="path-escape"
        ),
        pytest.param({"query": "a=%2f"}, {"query": "a=%2F"}, id="query-escape-case"),
        pytest.param({"path": "/t/a%2fb"}, {"path": "/t/a%2Fb"}, id="path-escape-case"),
        pytest.param({"method": "post"}, {"method": "POST"}, id="method-case"),
    ],
)
def test_v2_reserialisations_share_a_fingerprint(
    left: dict[str, Any], right: dict[str, Any]
) -> None:
    """Honest re-serialisations of one request have one version-2 fingerprint."""
    assert v2(**left) == v2(**right)


@pytest.mark.parametrize(
    ("left", "right"),
    [
        pytest.param({"body": b'{"a": 1}'}, {"body": b'{"a": 2}'}, id="value"),
        pytest.param({"body": b'{"a": 1}'}, {"body": b'{"b": 1}'}, id="name"),
        pytest.param({"body": b'{"a": 1}'}, {"body": b'{"a": "1"}'}, id="number-vs-string"),
        pytest.param({"body": b'{"a": true}'}, {"body": b'{"a": 1}'}, id="true-vs-1"),
        pytest.param({"body": b'{"a": null}'}, {"body": b"{}"}, id="null-vs-absent"),
        pytest.param({"body": b"[1,2]"}, {"body": b"[2,1]"}, id="array-order"),
        pytest.param({"body": b'"A"'}, {"body": b'"a"'}, id="string-case"),
        pytest.param(
            {"body": b"9007199254740993"}, {"body": b"9007199254740994"}, id="2**53+1-vs-2**53+2"
        ),
        pytest.param(
            {"body": b"9007199254740992"}, {"body": b"9007199254740993"}, id="2**53-vs-2**53+1"
        ),
        pytest.param(
            {"body": b"12345678901234567890"}, {"body": b"12345678901234567891"}, id="big-ids"
        ),
        pytest.param(
            {"body": b"0.1000000000000000055511151231257827"},
            {"body": b"0.1"},
            id="more-than-15-digits",
        ),
        pytest.param({"body": b"1e400"}, {"body": b"1e401"}, id="beyond-double-range"),
        pytest.param({"body": b"1e-400"}, {"body": b"0"}, id="underflow-is-not-zero"),
        pytest.param(
            {"content_type": "text/plain", "body": b'{"title": "x"}'},
            {"content_type": "application/json", "body": b'{"title": "x"}'},
            id="json-vs-same-bytes-as-text",
        ),
        pytest.param(
            {"content_type": "application/json"},
            {"content_type": "application/problem+json"},
            id="json-media-types",
        ),
        pytest.param({"query": "a=1&a=2"}, {"query": "a=2&a=1"}, id="repeated-parameter-order"),
        pytest.param({"query": "a=%2F"}, {"query": "a=/"}, id="reserved-escape-in-query"),
        pytest.param({"query": "a=%20"}, {"query": "a=+"}, id="space-escape-vs-plus"),
        pytest.param({"query": "a=1"}, {"query": "a=1&"}, id="empty-component"),
        pytest.param({"path": "/t/a%2Fb"}, {"path": "/t/a/b"}, id="reserved-escape-in-path"),
        pytest.param({"path": "/t/A"}, {"path": "/t/a"}, id="path-case"),
        pytest.param({"path": "/t/./a"}, {"path": "/t/a"}, id="dot-segment"),
        pytest.param({"path": "/t//a"}, {"path": "/t/a"}, id="double-slash"),
    ],
)
def test_v2_meaning_changes_change_it(left: dict[str, Any], right: dict[str, Any]) -> None:
    """Any change of meaning gives a different version-2 fingerprint."""
    assert v2(**left) != v2(**right)


@pytest.mark.parametrize(
    ("left", "right"),
    [
        pytest.param(b'{"a": 1,}', b'{"a":1,}', id="trailing-comma"),
        pytest.param(b'{"a": 1, "a": 2}', b'{"a":1,"a":2}', id="duplicate-names"),
        pytest.param(b'{"a": 1, "\\u0061": 1}', b'{"a":1,"a":1}', id="escaped-duplicate"),
        pytest.param(b'{"a": "\\ud800"}', b'{"a":"\\ud800"}', id="lone-surrogate"),
        pytest.param(b'{"\\udc00": 1}', b'{"\\udc00":1}', id="lone-surrogate-name"),
        pytest.param(b"[" * 65 + b"]" * 65, b"[ " * 65 + b"]" * 65, id="65-deep"),
        pytest.param(b'{"a": "\xff"}', b'{"a":"\xff"}', id="invalid-utf-8"),
        pytest.param(b'{"a": "\xed\xa0\x80"}', b'{"a":"\xed\xa0\x80"}', id="utf-8-surrogate"),
        pytest.param(b'\xef\xbb\xbf{"a": 1}', b'\xef\xbb\xbf{"a":1}', id="utf-8-bom"),
        pytest.param('{"a": 1}'.encode("utf-16"), '{"a":1}'.encode("utf-16"), id="utf-16"),
        pytest.param(b'{"a": NaN}', b'{"a":NaN}', id="nan"),
        pytest.param(b"[Infinity]", b"[ Infinity ]", id="infinity"),
        pytest.param(b"{'a': 1}", b"{'a':1}", id="single-quotes"),
        pytest.param(b"", b" ", id="empty"),
        pytest.param(b'{"a": 1} x', b'{"a":1} x', id="trailing-data"),
    ],
)
def test_v2_invalid_json_is_compared_as_bytes(left: bytes, right: bytes) -> None:
    """A body with no single JSON meaning is fingerprinted as bytes, without raising."""
    assert canonical_json(left) is None
    assert canonical_json(right) is None
    assert v2(body=left) != v2(body=right)
    assert v2(body=left) == v2(body=left)


def test_v2_depth_limit_counts_arrays_and_objects() -> None:
    """Nesting of 64 arrays and objects is still JSON; 65 is bytes."""
    assert MAX_JSON_DEPTH == 64
    deepest = b'{"a":' * 32 + b"[" * 32 + b"1" + b"]" * 32 + b"}" * 32
    assert canonical_json(deepest) == deepest
    assert canonical_json(b"[" * 64 + b"]" * 64) == b"[" * 64 + b"]" * 64
    assert v2(body=b"[ " * 64 + b"]" * 64) == v2(body=b"[" * 64 + b"]" * 64)
    assert canonical_json(b'{"a":' + deepest + b"}") is None
    assert canonical_json(b"[" * 65 + b"]" * 65) is None


def test_v2_hostile_bodies_never_raise() -> None:
    """Huge numbers and absurd nesting give a fingerprint, never an exception."""
    digits = b"1" * 5000
    assert canonical_json(digits) is not None
    assert canonical_json(digits) != canonical_json(b"1" * 4999 + b"2")
    assert canonical_json(b"1e" + b"9" * 5000) is None  # the exponent has no int value
    for body in (
        digits,
        b"[" + digits + b"]",
        b"1." + digits,
        b"[" * 100_000 + b"]" * 100_000,
        b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
        b"[" * 100_000,
    ):
        fingerprint = v2(body=body)
        assert fingerprint.startswith(FINGERPRINT_V2_PREFIX)
    assert canonical_json(b"[" * 100_000 + b"]" * 100_000) is None


@pytest.mark.parametrize(
    ("body", "canonical"),
    [
        (b'{"b": 1, "a": 2}', b'{"a":2,"b":1}'),
        (
            b"[1.5, -0.0, 1e21, 1e-7, 0.000001, 123e18]",
            b"[1.5,0,1e+21,1e-7,0.000001,123000000000000000000]",
        ),
        (b"9007199254740992", b"9007199254740992"),
        (b"-9007199254740992.0", b"-9007199254740992"),
        (b"9007199254740993", b"9007199254740993"),
        (b"1.000000000000000000", b"1"),
        (b"1.0000000000000001", b"1.0000000000000001"),
        (b"12345678901234567890.0", b"12345678901234567890"),
        (b"1.234567890123456789e19", b"12345678901234567890"),
        (b"1.2345678901234567891e-3", b"0.0012345678901234567891"),
        (b"1.2345678901234567891e-30", b"1.2345678901234567891e-30"),
        (b"1e400", b"1e+400"),
        (b"-1e-400", b"-1e-400"),
        (b"5e-324", b"5e-324"),
        (b"4.9e-324", b"4.9e-324"),
        (b'"\\u000a\\u001f\\u007f\\u2028"', b'"\\n\\u001f\x7f\xe2\x80\xa8"'),
        (b'{"\\ue000": 1, "\\ud83d\\ude00": 2}', '{"😀":2,"\ue000":1}'.encode()),
        (b" true ", b"true"),
        (b"null", b"null"),
    ],
)
def test_canonical_json_examples(body: bytes, canonical: bytes) -> None:
    """Canonical forms follow RFC 8785, with big numbers written exactly."""
    assert canonical_json(body) == canonical


@pytest.mark.parametrize(
    ("content_type", "is_json"),
    [
        ("application/json", True),
        ("Application/JSON; charset=UTF-8", True),
        ("  application/json  ", True),
        ("application/problem+json", True),
        ("application/vnd.api+json; ext=x", True),
        ("application/JSON-seq", False),
        ("application/jsonp", False),
        ("text/json", False),
        ("application/+json", False),
        ("/+json", False),
        ("application/x+json+xml", False),
        ("text/plain", False),
        ("", False),
        (None, False),
    ],
)
def test_is_json_media_type(content_type: str | None, is_json: bool) -> None:
    """JSON is `application/json` or a `+json` type, whatever the case and parameters."""
    assert is_json_media_type(content_type) is is_json


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        ("", ""),
        ("a=1", "a=1"),
        ("b=2&a=1", "a=1&b=2"),
        ("a=2&b=1&a=1", "a=2&a=1&b=1"),
        ("%61=%31&%62", "a=1&b"),
        ("a=%2f%2F%e2%82%ac", "a=%2F%2F%E2%82%AC"),
        ("a=b+c&a=%2B", "a=b+c&a=%2B"),
        ("a&&b", "&a&b"),
        ("a=%zz&b=%", "a=%zz&b=%"),
        ("a=%%341", "a=%%341"),
        ("x=%4%31", "x=%4%31"),
        ("b=1&a", "a&b=1"),
    ],
)
def test_canonical_query_examples(raw: str, canonical: str) -> None:
    """Unreserved escapes are decoded, others upper-cased, parameters sorted by name."""
    assert canonical_query(raw) == canonical


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        ("/tickets/v1/issues", "/tickets/v1/issues"),
        ("/%41%7a%30%2D%2e%5F%7E", "/Az0-._~"),
        ("/a%2fb%3A", "/a%2Fb%3A"),
        ("/a/../B//c/./", "/a/../B//c/./"),
        ("/%zz/%4/%", "/%zz/%4/%"),
        ("/%%341", "/%%341"),
    ],
)
def test_canonical_path_examples(raw: str, canonical: str) -> None:
    """Only escapes change in a path: no dot segments, case or slashes are touched."""
    assert canonical_path(raw) == canonical


# --- version 2: properties -------------------------------------------------------

_TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=12)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53) + 1, 2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _TEXT,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_TEXT, children, max_size=4),
    max_leaves=12,
)
serialisations = st.fixed_dictionaries(
    {
        "separators": st.sampled_from([(",", ":"), (", ", ": "), (" ,\n", " :\t")]),
        "indent": st.none() | st.sampled_from([0, 2, "\t"]),
        "ensure_ascii": st.booleans(),
        "sort_keys": st.booleans(),
    }
)


@given(json_values, serialisations)
@settings(max_examples=examples(150))
def test_canonical_json_matches_the_reference(value: Any, style: dict[str, Any]) -> None:
    """Any serialisation of a JSON value canonicalises to what `rfc8785.dumps` gives."""
    assert canonical_json(json.dumps(value, **style).encode()) == rfc8785.dumps(value)


@given(json_values, serialisations, serialisations, st.sampled_from(["", "; charset=utf-8"]))
@settings(max_examples=examples(60))
def test_reserialising_keeps_the_v2_fingerprint(
    value: Any, first: dict[str, Any], second: dict[str, Any], parameters: str
) -> None:
    """Re-serialising a JSON value in any style keeps its version-2 fingerprint."""
    assert v2(body=json.dumps(value, **first).encode()) == v2(
        body=json.dumps(value, **second).encode(), content_type="application/json" + parameters
    )


@given(st.integers(1, 10**25).map(str), st.integers(-340, 340), st.integers(0, 5), st.booleans())
@settings(max_examples=examples(150))
def test_numbers_are_compared_by_exact_value(
    digits: str, exponent: int, shift: int, negative: bool
) -> None:
    """Spellings of one number share a canonical form, which spells exactly that value."""
    sign = "-" if negative else ""
    plain = f"{sign}{digits}e{exponent}"
    shifted = f"{sign}{digits}{'0' * shift}.000e{exponent - shift}"
    canonical = canonical_json(plain.encode())
    assert canonical is not None
    assert canonical == canonical_json(shifted.encode())
    assert Decimal(canonical.decode()) == Decimal(plain)
    bumped = canonical_json(f"{sign}{digits}1e{exponent - 1}".encode())
    assert bumped != canonical


_QUERY_TEXT = st.text(st.sampled_from("ab=&%+2fF4167zZ~é/"), max_size=20)
_NAMES = st.text(st.sampled_from("abcxyz-_.~%20"), min_size=1, max_size=6)


@given(_QUERY_TEXT | st.text(max_size=20))
@settings(max_examples=examples(150))
def test_canonical_query_and_path_are_idempotent(raw: str) -> None:
    """Canonicalising a canonical query or path changes nothing."""
    assert canonical_query(canonical_query(raw)) == canonical_query(raw)
    assert canonical_path(canonical_path(raw)) == canonical_path(raw)


@given(
    st.dictionaries(_NAMES, st.text(st.sampled_from("0123abc%2f+="), max_size=5), min_size=1),
    st.randoms(use_true_random=False),
)
@settings(max_examples=examples(60))
def test_canonical_query_ignores_the_order_of_distinct_names(
    parameters: dict[str, str], random: Any
) -> None:
    """Parameters with distinct names can come in any order."""
    components = [f"{name}={value}" for name, value in parameters.items()]
    shuffled = list(components)
    random.shuffle(shuffled)
    assert canonical_query("&".join(components)) == canonical_query("&".join(shuffled))
    assert v2(query="&".join(components)) == v2(query="&".join(shuffled))


_JSONISH = st.text(st.sampled_from('[]{}",:0123456789.eE+- \ntrufalsn\\ud8\\udc'), max_size=40)


@given(st.binary(max_size=80) | st.text(max_size=40).map(str.encode) | _JSONISH.map(str.encode))
@settings(max_examples=examples(200))
def test_canonical_json_never_raises(body: bytes) -> None:
    """Arbitrary bytes or text give a canonical form or None, never an exception."""
    canonical = canonical_json(body)
    if canonical is not None:
        assert canonical_json(canonical) == canonical
    v2(body=body)


@given(st.text(st.characters(exclude_categories=()), max_size=40))
@settings(max_examples=examples(100))
def test_canonical_json_never_raises_on_surrogates(text: str) -> None:
    """Lone surrogates, as raw bytes or as escapes in a JSON string, make a body bytes."""
    read = json.loads(json.dumps(text))  # escaped surrogate pairs join into one character
    lone = any("\ud800" <= char <= "\udfff" for char in read)
    assert (canonical_json(json.dumps(text).encode()) is None) is lone
    raw = json.dumps(text, ensure_ascii=False).encode("utf-8", "surrogatepass")
    assert (canonical_json(raw) is None) is any("\ud800" <= char <= "\udfff" for char in text)


_PLAIN = st.text(st.characters(exclude_characters="%&", exclude_categories=["Cs"]), max_size=20)


@given(
    st.fixed_dictionaries(
        {
            "method": st.sampled_from(["POST", "PATCH", "PUT", "DELETE"]),
            "route": _PLAIN,
            "path": _PLAIN,
            "query": _PLAIN,
            "content_type": st.none() | st.just("text/plain"),
            "body": st.binary(max_size=64),
        }
    ),
    st.sampled_from(["method", "route", "path", "query", "content_type", "body"]),
    st.data(),
)
@settings(max_examples=examples(60))
def test_v2_every_part_changes_it(request: dict[str, Any], part: str, data: st.DataObject) -> None:
    """Changing any one part of a request to a non-equivalent value changes version 2 too."""
    other = dict(request)
    if part == "method":
        other["method"] = data.draw(st.sampled_from(["GET", "OPTIONS"]))
    elif part == "content_type":
        other["content_type"] = "application/xml"
    elif part == "body":
        other["body"] = request["body"] + data.draw(st.binary(min_size=1, max_size=4))
    else:
        other[part] = request[part] + data.draw(_PLAIN.filter(bool))
    assert fingerprint_request(**request) != fingerprint_request(**other)
