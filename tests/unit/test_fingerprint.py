"""Canonical fingerprints: the same intent hashes the same, whatever the body's layout."""

from __future__ import annotations

import json
import re

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.http import QueryDict
from django.test import RequestFactory

from idempotency.exceptions import RequestInvalid
from idempotency.fingerprint import canonical, fingerprint, parse_json
from idempotency.http import default_fingerprint


def canon_json(text: str | bytes, **options) -> str:
    return canonical(parse_json(text.encode() if isinstance(text, str) else text), **options)


def post_json(body: str | bytes, path: str = "/orders/", **extra) -> str:
    request = RequestFactory().post(path, data=body, content_type="application/json", **extra)
    return default_fingerprint(request)


class TestCanonicalJson:
    def test_key_order_does_not_matter(self):
        assert canon_json('{"a": 1, "b": 2}') == canon_json('{"b": 2, "a": 1}')

    def test_nested_key_order_does_not_matter(self):
        assert canon_json('{"o": {"x": 1, "y": [{"p": 1, "q": 2}]}}') == canon_json(
            '{"o": {"y": [{"q": 2, "p": 1}], "x": 1}}'
        )

    def test_whitespace_does_not_matter(self):
        assert canon_json('{"a":[1,2],"b":"c"}') == canon_json('{\n  "a" : [ 1 , 2 ],\t"b": "c"\n}')

    @pytest.mark.parametrize("other", ["1.0", "1.00", "1e0", "10e-1", "1.0E+0"])
    def test_number_forms_are_normalized(self, other):
        assert canon_json(f'{{"n": {other}}}') == canon_json('{"n": 1}')

    def test_zero_forms_are_normalized(self):
        assert canon_json("[0, 0.0, -0, 0e5]") == "[0,0,0,0]"

    def test_large_and_precise_numbers_stay_exact(self):
        assert canon_json("[12345678901234567890, 0.1, 1e21]") == (
            "[12345678901234567890,0.1,1000000000000000000000]"
        )

    def test_different_numbers_differ(self):
        assert canon_json('{"n": 1}') != canon_json('{"n": 1.000001}')

    def test_list_order_matters(self):
        assert canon_json("[1, 2]") != canon_json("[2, 1]")

    def test_string_one_differs_from_number_one(self):
        assert canon_json('{"n": "1"}') != canon_json('{"n": 1}')

    def test_true_differs_from_one(self):
        assert canon_json('{"n": true}') != canon_json('{"n": 1}')

    def test_null_differs_from_missing(self):
        assert canon_json('{"n": null}') != canon_json("{}")

    def test_canonical_text_is_compact_and_sorted(self):
        assert canon_json('{"b": [true, null], "a": "x"}') == '{"a":"x","b":[true,null]}'

    def test_python_floats_and_ints_agree(self):
        # DRF's JSON parser yields floats: they must canonicalize like exact decimals.
        assert (
            canonical({"n": 1.0, "m": 2.5})
            == canonical({"n": 1, "m": 2.5})
            == canon_json('{"n": 1, "m": 2.50}')
        )

    def test_unicode_strings_are_kept(self):
        assert canon_json('{"s": "caf\\u00e9"}') == canon_json('{"s": "café"}')

    def test_not_json_raises_value_error(self):
        with pytest.raises(ValueError):
            parse_json(b"{not json")


class TestFields:
    def test_include_keeps_only_named_top_level_fields(self):
        body = '{"sku": "a", "quantity": 1, "client_ts": 123}'
        assert canon_json(body, include={"sku", "quantity"}) == '{"quantity":1,"sku":"a"}'

    def test_exclude_drops_named_fields(self):
        first = canon_json('{"sku": "a", "nonce": 1}', exclude={"nonce"})
        second = canon_json('{"sku": "a", "nonce": 2}', exclude={"nonce"})
        assert first == second == '{"sku":"a"}'

    def test_include_and_exclude_together(self):
        body = '{"a": 1, "b": 2, "c": 3}'
        assert canon_json(body, include={"a", "b"}, exclude={"b"}) == '{"a":1}'

    def test_fields_only_apply_to_objects(self):
        assert canon_json("[1, 2]", include={"a"}) == "[1,2]"


class TestForms:
    def test_form_fields_are_sorted(self):
        assert canonical(QueryDict("b=2&a=1")) == canonical(QueryDict("a=1&b=2"))

    def test_repeated_form_values_keep_their_order(self):
        assert canonical(QueryDict("a=1&a=2")) == '{"a":["1","2"]}'
        assert canonical(QueryDict("a=1&a=2")) != canonical(QueryDict("a=2&a=1"))

    def test_form_values_are_strings(self):
        assert canonical(QueryDict("n=1")) != canonical({"n": [1]})

    def test_form_request_fingerprint_ignores_field_order(self):
        factory = RequestFactory()
        first = factory.post(
            "/orders/", data="sku=a&quantity=2", content_type="application/x-www-form-urlencoded"
        )
        second = factory.post(
            "/orders/", data="quantity=2&sku=a", content_type="application/x-www-form-urlencoded"
        )
        assert default_fingerprint(first) == default_fingerprint(second)

    def test_multipart_files_are_fingerprinted_by_content(self):
        factory = RequestFactory()

        def upload(content: bytes) -> str:
            file = SimpleUploadedFile("a.txt", content)
            return default_fingerprint(factory.post("/upload/", data={"f": file, "x": "1"}))

        assert upload(b"one") == upload(b"one")
        assert upload(b"one") != upload(b"two")


class TestRequestFingerprint:
    def test_is_sha256_hex(self):
        assert re.fullmatch(r"[0-9a-f]{64}", post_json('{"a": 1}'))

    def test_json_layout_does_not_change_it(self):
        compact = json.dumps({"sku": "a", "quantity": 1.0}, separators=(",", ":"))
        assert post_json(compact) == post_json('{ "quantity": 1,\n "sku": "a" }')

    def test_body_changes_it(self):
        assert post_json('{"quantity": 1}') != post_json('{"quantity": 2}')

    def test_route_changes_it(self):
        assert post_json("{}", path="/orders/") != post_json("{}", path="/refunds/")

    def test_method_changes_it(self):
        factory = RequestFactory()
        post = factory.post("/orders/1/", data="{}", content_type="application/json")
        put = factory.put("/orders/1/", data="{}", content_type="application/json")
        assert default_fingerprint(post) != default_fingerprint(put)

    def test_query_changes_it_but_not_its_order(self):
        assert post_json("{}", path="/o/?a=1&b=2") == post_json("{}", path="/o/?b=2&a=1")
        assert post_json("{}", path="/o/?a=1") != post_json("{}", path="/o/?a=2")

    def test_empty_body_is_allowed(self):
        assert post_json(b"") == post_json(b"")
        assert post_json(b"") != post_json("{}")

    def test_invalid_json_falls_back_to_raw_bytes(self):
        assert post_json(b"{oops") == post_json(b"{oops")
        assert post_json(b"{oops") != post_json(b"{oops }")

    def test_fields_option(self):
        factory = RequestFactory()

        def hashed(body: str, **options) -> str:
            request = factory.post("/o/", data=body, content_type="application/json")
            return default_fingerprint(request, **options)

        assert hashed('{"a": 1, "t": 1}', fields={"a"}) == hashed('{"a": 1, "t": 2}', fields={"a"})
        assert hashed('{"a": 1, "t": 1}', exclude={"t"}) == hashed(
            '{"a": 1, "t": 2}', exclude={"t"}
        )
        assert hashed('{"a": 1, "t": 1}') != hashed('{"a": 1, "t": 2}')


class TestParts:
    def test_parts_are_length_prefixed(self):
        assert fingerprint(["ab", "c"]) != fingerprint(["a", "bc"])

    def test_str_and_bytes_parts_agree(self):
        assert fingerprint(["abc"]) == fingerprint([b"abc"])


# -- numbers told apart exactly, depth bounded


@pytest.mark.parametrize(
    ("one", "other"),
    [
        (b"1e400", b'"Infinity"'),
        (b"-1e400", b'"-Infinity"'),
        (b"1e400", b"1e401"),
        (b"NaN", b'"NaN"'),
        (b"Infinity", b'"Infinity"'),
        (b"-Infinity", b"Infinity"),
        (b"1e400", b'"1e400"'),
        (b"0.1000000000000000000000000000001", b"0.1"),
        (b"12345678901234567890123456789012", b"12345678901234567890123456789013"),
    ],
)
def test_different_numbers_have_different_canonical_text(one, other):
    assert canonical(parse_json(one)) != canonical(parse_json(other))


@pytest.mark.parametrize(
    "spellings",
    [
        [b"1", b"1.0", b"1.00", b"1e0", b"10e-1", b"0.1e1"],
        [b"1e400", b"10e399", b"1.0e400", b"1E+400"],
        [b"0", b"-0", b"0.0", b"0e10"],
        [b"-2.50", b"-2.5", b"-25e-1"],
    ],
)
def test_spellings_of_one_number_share_their_canonical_text(spellings):
    assert len({canonical(parse_json(raw)) for raw in spellings}) == 1


def test_canonical_numbers_keep_their_plain_text_and_stay_short():
    assert [canonical(parse_json(raw)) for raw in (b"19.90", b"1200", b"0.005")] == [
        "19.9",
        "1200",
        "0.005",
    ]
    assert canonical(parse_json(b"1e999999999")) == "1e+999999999"  # not a billion zeros
    assert canonical(float("inf")) == "Infinity" != canonical("Infinity")
    assert canonical(float("nan")) == "NaN" != canonical("NaN")
    assert canonical(10**70) == canonical(parse_json(b"1e70"))


def test_json_deeper_than_the_bound_is_refused_at_any_depth():
    assert parse_json(b"[" * 100 + b"]" * 100) is not None
    for depth in (101, 5_000, 200_000):
        with pytest.raises(RequestInvalid, match="more than 100 levels"):
            parse_json(b"[" * depth + b"]" * depth)


@pytest.mark.parametrize("raw", [b"1e9999999999999999999999", b"[-1e-9999999999999999999999]"])
def test_a_number_no_decimal_can_hold_is_refused(raw):
    with pytest.raises(RequestInvalid, match="exponent is out of range"):
        parse_json(raw)


def test_data_deeper_than_the_bound_is_refused_not_overflowed():
    data: list = []
    for _ in range(10_000):
        data = [data]
    with pytest.raises(RequestInvalid):
        canonical({"items": data})


class TestQueryString:
    """The fingerprint of a request without a query string is computed without parsing one."""

    def test_the_hash_of_a_request_without_a_query_string_is_unchanged(self):
        # What every record made before stores: a retry after an upgrade must replay, not 422.
        expected = fingerprint(["POST", "/orders/", json.dumps([]), canonical({"sku": "a"})])
        assert post_json('{"sku": "a"}') == expected

    def test_a_query_string_is_part_of_the_request(self):
        assert post_json('{"sku": "a"}', path="/orders/?x=1") != post_json('{"sku": "a"}')

    def test_an_empty_query_string_is_no_query(self):
        assert post_json('{"sku": "a"}', QUERY_STRING="") == post_json('{"sku": "a"}')

    def test_a_query_set_on_the_request_counts_without_a_query_string(self):
        request = RequestFactory().post(
            "/orders/", data='{"sku": "a"}', content_type="application/json", QUERY_STRING=""
        )
        request.GET = QueryDict("x=1")  # as a middleware may set it
        assert default_fingerprint(request) == post_json('{"sku": "a"}', path="/orders/?x=1")


class TestBodyText:
    """The body's bytes are decoded strictly, before the parse: json.loads on bytes is not."""

    @pytest.mark.parametrize("bad", [b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xff", b"\xc0\xaf"])
    def test_bytes_that_are_not_utf8_are_refused(self, bad):
        raw = b'{"sku": "a", "note": "' + bad + b'"}'
        with pytest.raises(RequestInvalid, match="not valid UTF-8 text"):
            parse_json(raw)

    def test_utf16_detected_by_its_zeros_and_a_bom_are_still_read(self):
        text = '{"sku": "é"}'
        assert parse_json(text.encode("utf-16-le")) == {"sku": "é"}
        assert parse_json(b"\xef\xbb\xbf" + text.encode()) == {"sku": "é"}

    def test_an_escaped_surrogate_is_json_text_and_is_left_to_the_view(self):
        # ASCII on the wire: valid UTF-8; what the view makes of "\ud800" is its own business.
        assert parse_json(b'{"note": "\\ud800"}') == {"note": "\ud800"}
