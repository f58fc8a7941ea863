"""Message ids for the dedup bolt: each source, and a clear reason when there is none."""

from __future__ import annotations

import pytest

from dedup.ids import id_reader
from kspout.kafka import Record
from kspout.kafka.records import Headers


def record(key: bytes | None = None, value: bytes | None = b"", headers: Headers = ()) -> Record:
    return Record("t", 0, 0, key, value, -1, headers)


def test_the_key_is_the_id() -> None:
    read = id_reader("key")
    assert read(record(key=b"order-7")) == ("order-7", "")
    assert read(record(key=None)) == (None, "no message id: the message has no key")
    assert read(record(key=b""))[0] is None


def test_a_binary_key_cannot_collide_with_a_text_key() -> None:
    read = id_reader("key")
    binary, text = read(record(key=b"\xff")), read(record(key=b"ff"))
    assert binary[0] == "x:ff" and text[0] == "ff"


def test_a_header_is_the_id() -> None:
    read = id_reader("header:msg-id")
    assert read(record(headers=(("other", b"x"), ("msg-id", b"A-1")))) == ("A-1", "")
    assert read(record(headers=(("msg-id", None),)))[1] == "no message id: header 'msg-id' is empty"
    assert read(record(headers=()))[1] == "no message id: no header 'msg-id'"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (b'{"order": 5}', "5"),
        (b'{"order": "A-5", "x": 1}', "A-5"),
        (b'{"order": ""}', None),
        (b'{"order": {"nested": 1}}', None),
        (b'{"other": 1}', None),
        (b"[1, 2]", None),
        (b"not json", None),
    ],
)
def test_a_json_field_is_the_id(value: bytes, expected: str | None) -> None:
    found, why = id_reader("json:order")(record(value=value))
    assert found == expected
    assert (why == "") == (expected is not None)
    if expected is None:
        assert why.startswith("no message id")


def test_an_unknown_source_is_refused() -> None:
    with pytest.raises(ValueError, match="id_source"):
        id_reader("partition")
