"""Message ids for the dedup bolt: each source, typed ids that never collide, and a clear
reason when there is no id."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dedup.ids import IdResult, id_reader
from kspout.kafka import Record
from kspout.kafka.records import Headers


def record(key: bytes | None = None, value: bytes | None = b"", headers: Headers = ()) -> Record:
    return Record("t", 0, 0, key, value, -1, headers)


def by_key(key: bytes) -> IdResult:
    return id_reader("key")(record(key=key))


def by_header(value: bytes) -> IdResult:
    return id_reader("header:msg-id")(record(headers=(("msg-id", value),)))


def by_json(text: str) -> IdResult:
    """The id of `{"order": <text>}`: `text` is the field's JSON as a producer wrote it."""
    return id_reader("json:order")(record(value=b'{"order": %s}' % text.encode()))


def test_the_key_is_the_id() -> None:
    read = id_reader("key")
    assert read(record(key=b"order-7")) == ("order-7", "")
    assert read(record(key=None)) == (None, "no message id: the message has no key")
    assert read(record(key=b""))[0] is None


def test_a_header_is_the_id() -> None:
    read = id_reader("header:msg-id")
    assert read(record(headers=(("other", b"x"), ("msg-id", b"A-1")))) == ("A-1", "")
    assert read(record(headers=(("msg-id", None),)))[1] == "no message id: header 'msg-id' is empty"
    assert read(record(headers=()))[1] == "no message id: no header 'msg-id'"


@pytest.mark.parametrize(
    ("field", "expected"),
    [
        ('"A-5"', "A-5"),  # text is itself: the ids earlier versions wrote
        ('"~5"', "~~5"),
        ("5", "~5"),
        ("-5", "~-5"),
        ("2.50", "~2.50"),  # exactly as written: no float rounding
        ("1e400", "~1E+400"),  # beyond a float, still exact
        ("123456789012345678901234567890", "~123456789012345678901234567890"),
    ],
)
def test_a_json_field_is_the_id(field: str, expected: str) -> None:
    assert by_json(field) == (expected, "")


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (b'{"order": ""}', "JSON field 'order' is empty"),
        (b'{"order": null}', "JSON field 'order' is null"),
        (b'{"other": 1}', "JSON field 'order' is missing"),
        (b'{"order": true}', "JSON field 'order' is true: a boolean cannot tell messages apart"),
        (b'{"order": false}', "is false"),
        (b'{"order": {"nested": 1}}', "is an object or an array"),
        (b'{"order": [1]}', "is an object or an array"),
        (b'{"order": NaN}', "is NaN, not a finite number"),
        (b'{"order": -Infinity}', "is -Infinity, not a finite number"),
        (b'{"order": "\\ud800"}', "lone surrogate"),
        (b"[1, 2]", "the value is JSON but not an object"),
        (b"not json", "the value is not JSON"),
        (b'{"order": "\xff"}', "the value is not JSON"),
    ],
)
def test_what_cannot_be_an_id_is_refused_with_the_reason(value: bytes, why: str) -> None:
    """Refused values reach the dead-letter topic (INVALID) with this reason as the error."""
    found, reason = id_reader("json:order")(record(value=value))
    assert found is None
    assert reason.startswith("no message id: ") and why in reason


@pytest.mark.parametrize(
    ("one", "other"),
    [
        (by_key(b"\xff\xfe"), by_key(b"x:fffe")),  # was x:fffe for both
        (by_key(b"\xff\xfe"), by_key(b"~xfffe")),
        (by_header(b"\xff\xfe"), by_header(b"x:fffe")),
        (by_json("1"), by_json('"1"')),  # was 1 for both
        (by_json("1.5"), by_json('"1.5"')),
        (by_json("10000000000000001.0"), by_json("10000000000000000.0")),  # one float
        (by_json("-1"), by_json('"-1"')),
        (by_json("1"), by_json('"~1"')),
    ],
)
def test_the_collisions_of_untyped_ids_are_gone(one: IdResult, other: IdResult) -> None:
    assert one[0] is not None and other[0] is not None
    assert one[0] != other[0]


def test_true_no_longer_shares_the_id_of_the_text_true() -> None:
    """JSON `true` became the id `True`, the id of the text "True"; now it has no id at all."""
    assert by_json("true")[0] is None
    assert by_json('"True"') == ("True", "")


# -- injectivity: distinct values never share an id -------------------------------------------

# Texts from a few characters, so that the tag, hex digits and number shapes come up often.
texts = st.text(alphabet="~x:ff01-.eE ab", min_size=1, max_size=6) | st.text(min_size=1)
raw = st.binary(min_size=1, max_size=6)
numbers = (
    st.integers(-(10**30), 10**30).map(str)
    | st.decimals(allow_nan=False, allow_infinity=False).map(lambda d: f"{d:e}")
    | st.floats(allow_nan=False, allow_infinity=False).map(repr)
)

# Each input: (its value as a message carries it, how it is read). A value is text, bytes that
# are not UTF-8, or a number; what is "the same value" is decided by `value_of`.
inputs = st.one_of(
    st.tuples(st.just("key"), raw | texts.map(str.encode)),
    st.tuples(st.just("header"), raw | texts.map(str.encode)),
    st.tuples(st.just("json"), texts.map(json.dumps) | numbers),
)


def read(source: str, payload: bytes | str) -> str | None:
    if source == "key":
        assert isinstance(payload, bytes)
        return by_key(payload)[0]
    if source == "header":
        assert isinstance(payload, bytes)
        return by_header(payload)[0]
    assert isinstance(payload, str)
    return by_json(payload)[0]


def value_of(source: str, payload: bytes | str) -> tuple[str, object]:
    """What the input means: a text (whatever carried it), raw bytes, or a number's value."""
    if isinstance(payload, bytes):
        try:
            return "text", payload.decode()
        except UnicodeDecodeError:
            return "bytes", payload
    parsed = json.loads(payload, parse_float=Decimal, parse_int=Decimal)
    return ("text", parsed) if isinstance(parsed, str) else ("number", parsed)


@given(st.lists(inputs, min_size=2, max_size=40))
def test_distinct_values_never_share_an_id(given_inputs: list[tuple[str, bytes | str]]) -> None:
    """Over keys, headers and JSON fields: two inputs with one id carry the same value."""
    meaning: dict[str, tuple[str, object]] = {}
    for source, payload in given_inputs:
        found = read(source, payload)
        assert found is not None, (source, payload)
        value = value_of(source, payload)
        assert meaning.setdefault(found, value) == value, f"{found!r}: {meaning[found]} and {value}"


def test_an_unknown_source_is_refused() -> None:
    with pytest.raises(ValueError, match="id_source"):
        id_reader("partition")
