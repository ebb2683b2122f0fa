"""The Idempotency-Key header: bare tokens and sf-strings mean the same key."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from gateway.engine.errors import InvalidKey
from gateway.engine.keys import MAX_KEY_LENGTH, format_key_header, parse_idempotency_key

printable_keys = st.text(
    alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=1, max_size=255
)
# What a key may be: printable ASCII without whitespace at either end.
trimmed_keys = printable_keys.filter(lambda key: key.strip(" \t") == key)


def sf_string(key: str) -> str:
    """Serialize a key as an RFC 8941 sf-string."""
    return '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'


@given(printable_keys)
def test_bare_token_round_trips(key: str) -> None:
    """A printable key not starting with a quote nor padded with spaces is its own key."""
    assume(not key.startswith('"') and key.strip(" \t") == key)
    assert parse_idempotency_key([key]) == key


@given(trimmed_keys)
def test_sf_string_round_trips(key: str) -> None:
    """Any printable key without outer whitespace sent as an sf-string normalizes to itself."""
    assert parse_idempotency_key([sf_string(key)]) == key


@given(printable_keys)
def test_padded_sf_string_is_refused(key: str) -> None:
    """An sf-string with whitespace just inside a quote is refused, whatever the key."""
    for padded in (" " + key, key + " "):
        with pytest.raises(InvalidKey, match="whitespace just inside its quotes"):
            parse_idempotency_key([sf_string(padded)])


@given(trimmed_keys)
def test_format_key_header_parses_back(key: str) -> None:
    """The response header form of any key that can be stored parses back to the same key."""
    assert parse_idempotency_key([format_key_header(key)]) == key


@given(st.one_of(st.text(min_size=1, max_size=300), printable_keys, printable_keys.map(sf_string)))
def test_accepted_keys_are_trimmed_and_name_themselves_quoted_or_bare(value: str) -> None:
    """An accepted key has no outer whitespace; its quoted and bare forms parse to it."""
    try:
        key = parse_idempotency_key([value])
    except InvalidKey:
        return
    assert key is not None
    assert key.strip(" \t") == key
    assert parse_idempotency_key([sf_string(key)]) == key
    if not key.startswith('"'):  # a bare value starting with '"' is read as an sf-string
        assert parse_idempotency_key([key]) == key


def test_format_key_header_is_bare_when_unambiguous() -> None:
    """Keys are echoed bare, as clients send them, unless that would read back differently."""
    assert format_key_header("run-77:0:c1") == "run-77:0:c1"
    assert format_key_header('"x') == '"\\"x"'
    # A key stored before outer whitespace was refused is shown exactly, quoted.
    assert format_key_header(" x") == '" x"'


def test_absent_header_is_none() -> None:
    """No header value at all means the key is absent."""
    assert parse_idempotency_key([]) is None


@pytest.mark.parametrize(
    ("value", "key"),
    [
        (" abc\t", "abc"),
        ('\t"abc" ', "abc"),
        ('"a b"', "a b"),
        ('"a  b"', "a  b"),
        ("a b", "a b"),
        ('"a\\"b"', 'a"b'),
        ('"a\\\\b"', "a\\b"),
        ('a"b', 'a"b'),
        ("a,b", "a,b"),
    ],
)
def test_normalization(value: str, key: str) -> None:
    """Whitespace around the value is dropped, sf-strings unescaped, inner characters kept."""
    assert parse_idempotency_key([value]) == key


def test_longest_key_is_accepted() -> None:
    """A key of exactly MAX_KEY_LENGTH characters is accepted, quoted or not."""
    assert MAX_KEY_LENGTH == 255
    assert parse_idempotency_key(["k" * 255]) == "k" * 255
    assert parse_idempotency_key(['"' + "k" * 255 + '"']) == "k" * 255


def test_length_is_measured_after_unescaping() -> None:
    """An sf-string longer than 255 on the wire is fine when its key is 255 characters."""
    assert parse_idempotency_key([sf_string("\\" * 255)]) == "\\" * 255


@pytest.mark.parametrize(
    ("values", "rule"),
    [
        ([""], "empty"),
        (["   "], "empty"),
        (['""'], "empty"),
        (["k" * 256], "256 characters long; the limit is 255"),
        (['"' + "k" * 256 + '"'], "256 characters long"),
        (["clé"], "outside printable ASCII"),
        (['"clé"'], "outside printable ASCII"),
        (["a\x00b"], "outside printable ASCII"),
        (["a\x7fb"], "outside printable ASCII"),
        (["a\nb"], "outside printable ASCII"),
        (['"a\tb"'], "outside printable ASCII"),
        (["a", "a"], "sent twice"),
        (["a", "b"], "sent twice"),
        (['"  pay-42 "'], "whitespace just inside its quotes"),
        (['" abc"'], "whitespace just inside its quotes"),
        (['"abc "'], "whitespace just inside its quotes"),
        (['" "'], "whitespace just inside its quotes"),
        (['"abc'], "no closing quote"),
        (['"abc\\"'], "no closing quote"),
        (['"abc"def'], "after its closing quote"),
        (['"abc" "def"'], "after its closing quote"),
        (['"a\\nb"'], "invalid escape"),
        (['"abc\\'], "invalid escape"),
    ],
)
def test_malformed_headers_are_refused(values: list[str], rule: str) -> None:
    """Each broken rule is refused with InvalidKey whose detail names that rule."""
    with pytest.raises(InvalidKey, match=rule) as caught:
        parse_idempotency_key(values)
    assert caught.value.status == 400
    assert caught.value.problem_type == "invalid-key"


@given(st.text(min_size=1, max_size=300))
def test_any_header_value_either_parses_or_is_invalid_key(value: str) -> None:
    """No header value makes the parser fail with anything but InvalidKey."""
    try:
        key = parse_idempotency_key([value])
    except InvalidKey:
        return
    assert key is not None
    assert 1 <= len(key) <= MAX_KEY_LENGTH
    assert all(" " <= char <= "~" for char in key)


def test_a_str_is_not_a_list_of_values() -> None:
    """Passing one string instead of the list of values is a programming error."""
    with pytest.raises(TypeError):
        parse_idempotency_key("abc")


@given(printable_keys)
def test_every_key_the_client_accepts_the_gateway_reads_back(key: str) -> None:
    """The Python client's `validate_key` and header form agree with the gateway's parser:
    a key the client lets an agent use reaches the gateway as exactly that key (a client
    that accepted " lead" sent `" lead"`, which the gateway refuses: 400 invalid-key)."""
    from idempotency_gateway_client import KeyFormatError, validate_key
    from idempotency_gateway_client._client import key_header

    try:
        validate_key(key)
    except KeyFormatError:
        return
    assert parse_idempotency_key([key_header(key)]) == key
