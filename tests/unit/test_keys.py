"""Key rules: 1..MAX_KEY_LENGTH visible ASCII characters, no ``,`` or ``"``, SF string form."""

from __future__ import annotations

import pytest
from django.test import RequestFactory, override_settings

from idempotency.exceptions import KeyInvalid, KeyMissing
from idempotency.http import IdempotencyOptions, read_key
from idempotency.keys import parse_key, validate_key

VISIBLE_ASCII = "".join(chr(code) for code in range(0x21, 0x7F) if chr(code) not in ',"')


def parse(raw: str, max_length: int = 255) -> str:
    return parse_key(raw, max_length=max_length)


def header_key(value: str | None, options: IdempotencyOptions | None = None) -> str | None:
    headers = {} if value is None else {"Idempotency-Key": value}
    request = RequestFactory().post("/orders/", headers=headers)
    return read_key(request, options or IdempotencyOptions())


@pytest.mark.parametrize(
    "key",
    ["a", "abc", "550e8400-e29b-41d4-a716-446655440000", "!", "~", VISIBLE_ASCII, "x" * 255],
)
def test_valid_keys_are_returned_unchanged(key):
    assert parse(key) == key


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param("", id="empty"),
        pytest.param('""', id="empty-quoted"),
        pytest.param("a b", id="inner-space"),
        pytest.param("a\tb", id="tab"),
        pytest.param("a\nb", id="newline"),
        pytest.param("a\x00b", id="nul"),
        pytest.param("a\x1fb", id="unit-separator"),
        pytest.param("a\x7fb", id="del"),
        pytest.param("caf\u00e9", id="latin-1"),
        pytest.param("\u5bc6\u94a5", id="cjk"),
        pytest.param("a,b", id="comma"),
        pytest.param('a"b', id="double-quote"),
        pytest.param('"', id="lone-quote"),
        pytest.param("x" * 256, id="too-long"),
    ],
)
def test_invalid_keys_are_rejected(raw):
    with pytest.raises(KeyInvalid):
        parse(raw)


def test_surrounding_whitespace_is_not_part_of_the_key():
    assert parse("  abc\t") == "abc"


def test_only_whitespace_is_empty():
    with pytest.raises(KeyInvalid):
        parse("   ")


def test_length_bound_is_inclusive():
    assert parse("k" * 10, max_length=10) == "k" * 10
    with pytest.raises(KeyInvalid):
        parse("k" * 11, max_length=10)


def test_structured_field_string_equals_bare_form():
    assert parse('"abc"') == parse("abc") == "abc"


def test_quotes_do_not_count_towards_the_length():
    assert parse('"' + "q" * 255 + '"') == "q" * 255


def test_escaped_backslash_is_unwrapped():
    assert parse(r'"a\\b"') == "a\\b"


def test_escaped_quote_unwraps_to_a_forbidden_character():
    with pytest.raises(KeyInvalid):
        parse(r'"a\"b"')


@pytest.mark.parametrize("raw", [r'"a\nb"', r'"a\x"', '"abc\\"'], ids=["letter", "x", "trailing"])
def test_invalid_escapes_are_rejected(raw):
    with pytest.raises(KeyInvalid):
        parse(raw)


def test_unbalanced_quote_is_not_unwrapped():
    with pytest.raises(KeyInvalid):
        parse('"abc')


def test_validate_key_does_not_unwrap():
    with pytest.raises(KeyInvalid):
        validate_key('"abc"', max_length=255)


def test_error_says_what_is_allowed():
    with pytest.raises(KeyInvalid) as caught:
        parse("a b")
    assert "0x21 to 0x7E" in caught.value.detail
    assert caught.value.code == "idempotency_key_invalid"


class TestFromTheRequest:
    def test_header_is_read(self):
        assert header_key("order-1") == "order-1"

    def test_quoted_header_is_unwrapped(self):
        assert header_key('"order-1"') == "order-1"

    def test_missing_header_is_missing_when_required(self):
        with pytest.raises(KeyMissing):
            header_key(None)

    def test_missing_header_is_none_when_optional(self):
        assert header_key(None, IdempotencyOptions(required=False)) is None

    def test_empty_header_is_invalid_not_missing(self):
        with pytest.raises(KeyInvalid):
            header_key("")

    @override_settings(IDEMPOTENCY={"MAX_KEY_LENGTH": 8})
    def test_max_key_length_setting(self):
        assert header_key("k" * 8) == "k" * 8
        with pytest.raises(KeyInvalid):
            header_key("k" * 9)

    @override_settings(IDEMPOTENCY={"HEADER": "X-Request-Key"})
    def test_header_name_setting(self):
        request = RequestFactory().post("/orders/", headers={"X-Request-Key": "abc"})
        assert read_key(request, IdempotencyOptions()) == "abc"

    @override_settings(IDEMPOTENCY={"REQUIRE_KEY": False})
    def test_require_key_setting(self):
        assert header_key(None) is None

    def test_key_callable_result_is_validated(self):
        options = IdempotencyOptions(key=lambda request: "has space")
        with pytest.raises(KeyInvalid):
            header_key(None, options)

    @override_settings(IDEMPOTENCY={"MAX_KEY_LENGTH": 4})
    def test_key_callable_result_obeys_max_length(self):
        options = IdempotencyOptions(key=lambda request: "12345")
        with pytest.raises(KeyInvalid):
            header_key(None, options)


@pytest.mark.parametrize(("returned", "found"), [(42, r"42 \(int\)"), ("", "an empty string")])
def test_a_key_callable_that_returns_no_string_is_refused_naming_it(returned, found):
    def trade_key(request: object) -> object:
        return returned

    with pytest.raises(KeyInvalid, match=rf"trade_key, returned {found}: .*non-empty string"):
        header_key(None, IdempotencyOptions(key=trade_key))


def test_a_key_callable_returning_none_means_the_request_has_no_key():
    def charge_id(request: object) -> None:
        return None

    with pytest.raises(KeyMissing, match="The key function .*charge_id found none"):
        header_key(None, IdempotencyOptions(key=charge_id))
    assert header_key(None, IdempotencyOptions(key=lambda request: None, required=False)) is None
