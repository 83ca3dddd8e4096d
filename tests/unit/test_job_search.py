"""The search forms people type (dispatcher/api/job_filters.py): key=value pairs or a JSON object
for the payload, an id list; and Filters' checks of a payload, an error text and a window's floor,
each refused naming its field before any statement is built."""

from __future__ import annotations

import pytest

from dispatcher.admin import AdminInputError, Filters, id_list, payload_filter
from dispatcher.api.job_filters import MAX_ERROR_CHARS, MAX_ID_LIST, MAX_PAYLOAD_FORMS


@pytest.mark.parametrize(
    "text, expected",
    [
        # a bare number matches the number or its text
        ("order=8812", ({"order": 8812}, {"order": "8812"})),
        # dots nest
        ("customer.id=5", ({"customer": {"id": 5}}, {"customer": {"id": "5"}})),
        # a word, or a quoted string (spaces, commas, a number's text alone): that string only
        ("state=open", {"state": "open"}),
        ('name="Ada Lovelace, 1815"', {"name": "Ada Lovelace, 1815"}),
        ('code="5"', {"code": "5"}),
        ('path="a\\"b"', {"path": 'a"b'}),
        ("note=", {"note": ""}),
        # true, false, null and decimals are scalars too
        ("vip=true", ({"vip": True}, {"vip": "true"})),
        ("gone=null", ({"gone": None}, {"gone": "null"})),
        ("rate=1.5", ({"rate": 1.5}, {"rate": "1.5"})),
        # not JSON: a string (leading zeros, a bare word that starts like a number)
        ("zip=01234", {"zip": "01234"}),
        # several pairs, spaces or commas between them: all must hold
        (
            "a.b=x,a.c=y  d=z",
            {"a": {"b": "x", "c": "y"}, "d": "z"},
        ),
        (
            "n=1 s=x",
            ({"n": 1, "s": "x"}, {"n": "1", "s": "x"}),
        ),
        # a JSON object as it is
        ('{"order": 8812, "tags": ["x"]}', {"order": 8812, "tags": ["x"]}),
        ('  {"a": {"b": null}}  ', {"a": {"b": None}}),
    ],
)
def test_the_payload_forms_people_type(text, expected):
    assert payload_filter(text) == expected
    Filters(payload=expected)  # what the form gives, Filters takes


def test_two_number_like_values_match_each_combination():
    forms = payload_filter("a=1 b=2")
    assert set(map(str, forms)) == {
        str({"a": 1, "b": 2}),
        str({"a": 1, "b": "2"}),
        str({"a": "1", "b": 2}),
        str({"a": "1", "b": "2"}),
    }


@pytest.mark.parametrize(
    "text, words",
    [
        ("", "empty"),
        ("   ", "empty"),
        ("order", "cannot read"),
        ("=5", "cannot read"),
        ("a=1 =2", "cannot read"),
        ('k="open', "cannot read"),
        ("a..b=1", "empty part"),
        (".a=1", "empty part"),
        ("a=1 a=2", "given twice"),
        ("a=1 a.b=2", "given twice"),
        ("a.b=2 a=1", "given twice"),
        ("{not json}", "not a JSON object"),
        ("{}", "at least one key"),
        ('{"a": 1', "not a JSON object"),
        ("a=1 b=2 c=3 d=4 e=5", "quote the others"),
    ],
)
def test_a_payload_form_that_is_neither_is_refused_naming_the_field(text, words):
    with pytest.raises(AdminInputError, match=words) as info:
        payload_filter(text)
    assert info.value.option == "payload"
    with pytest.raises(AdminInputError) as named:
        payload_filter(text, "--payload")
    assert named.value.option == "--payload"


def test_an_id_list_is_comma_or_space_separated_each_once():
    assert id_list("12, 40 41,,12\n7") == (12, 40, 41, 7)
    assert id_list("") == () and id_list(" , ") == ()
    assert len(id_list(" ".join(map(str, range(1, MAX_ID_LIST + 1))))) == MAX_ID_LIST
    for bad in ("12 x", "0", "-3", "1.5", "²", "9" * 19):
        with pytest.raises(AdminInputError) as info:
            id_list(bad)
        assert info.value.option == "ids", bad
    with pytest.raises(AdminInputError, match=f"at most {MAX_ID_LIST}"):
        id_list(" ".join(map(str, range(1, MAX_ID_LIST + 2))))


@pytest.mark.parametrize(
    "kwargs, option",
    [
        ({"payload": "order=1"}, "payload"),  # the text form is payload_filter's, not Filters'
        ({"payload": [{"a": 1}]}, "payload"),
        ({"payload": ()}, "payload"),
        ({"payload": ({"a": 1}, "x")}, "payload"),
        ({"payload": tuple({"a": i} for i in range(MAX_PAYLOAD_FORMS + 1))}, "payload"),
        ({"payload": {"a": object()}}, "payload"),
        ({"payload": {1: "x"}}, "payload"),
        ({"payload": {"a": "x" * 5000}}, "payload"),
        ({"payload": {"a": "nul\x00"}}, "payload"),
        ({"error": ""}, "error"),
        ({"error": "x" * (MAX_ERROR_CHARS + 1)}, "error"),
        ({"error": "nul\x00"}, "error"),
        ({"error": 5}, "error"),
        ({"min_id": 0}, "ids"),
        ({"min_id": True}, "ids"),
    ],
)
def test_bad_search_filters_are_refused_naming_the_field(kwargs, option):
    with pytest.raises(AdminInputError) as info:
        Filters(**kwargs)
    assert info.value.option == option


def test_the_search_filters_become_parameters():
    params = Filters(payload={"order": 8812}, error="50%_off\\now", min_id=7).params()
    assert params["payload"] == ['{"order":8812}']
    # the error text is a substring: its LIKE wildcards and the escape character taken literally
    assert params["error_like"] == "%50\\%\\_off\\\\now%"
    assert params["min_id"] == 7
    forms = Filters(payload=payload_filter("order=8812")).params()["payload"]
    assert forms == ['{"order":8812}', '{"order":"8812"}']
    assert {k: Filters().params()[k] for k in ("payload", "error_like", "min_id")} == dict.fromkeys(
        ("payload", "error_like", "min_id")
    )
