"""Message ids for the dedup bolt: from the key, a header, or a top-level JSON field.

The source is the topic config's `[dedup] id_source`. An id is a Redis key, and two messages
that share one are one message to the bolt (the second is dropped as a DUPLICATE), so ids are
typed: distinct values never share an id.

    value                                          id                example
    text: a UTF-8 key or header, a JSON string     the text          order-7 -> order-7
    text that starts with ~                        ~ + the text      ~7 -> ~~7
    a key or header that is not UTF-8              ~x + its hex      b"\\xff\\xfe" -> ~xfffe
    a JSON number, exact (never a float)           ~ + the number    1 -> ~1, 2.50 -> ~2.50

Only a text id may start with anything but `~`, and a text that starts with `~` gets a second
one, which no other kind has (hex and numbers start with `x`, a digit or `-`). So each id has
one reading, and the usual ids (text) are the value itself: readable in Redis, and the same ids
earlier versions wrote. The text `1` is one id whether it came from a key, a header or a JSON
string; the number 1 is another. Numbers are read exactly (Decimal, never float), so
10000000000000001.0 and 10000000000000000.0 stay two ids; `1.5` and `1.50` are two ids too.

A message has no id, and the bolt sends it to the dead-letter topic (INVALID) with the reason
given here, when the key or header is missing or empty, or the value is not a JSON object, or
the field is missing, null, "", true or false (two values cannot tell messages apart), an object
or an array, NaN or Infinity, or a string with a lone surrogate (`"\\ud800"`: it has no UTF-8
form, so it cannot be a Redis key).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from decimal import Decimal

from kspout.kafka import Record

IdResult = tuple[str | None, str]  # (id, or None and why not)
IdReader = Callable[[Record], IdResult]

TAG = "~"  # starts every id that is not plain text


def id_reader(source: str) -> IdReader:
    """A function that reads a record's id per `source`: key | header:<name> | json:<field>."""
    kind, _, name = source.partition(":")
    if source == "key":
        return _from_key
    if kind == "header" and name:
        return lambda record: _from_header(record, name)
    if kind == "json" and name:
        return lambda record: _from_json(record, name)
    raise ValueError(f"id_source {source!r}: expected key, header:<name> or json:<field>")


def text_id(text: str) -> str:
    """The id of a text: itself, with a second `~` when it starts with one."""
    return TAG + text if text.startswith(TAG) else text


def bytes_id(raw: bytes) -> str:
    """The id of a key or header: its text when it is UTF-8, else `~x` and its hex."""
    try:
        return text_id(raw.decode())
    except UnicodeDecodeError:
        return TAG + "x" + raw.hex()


def json_id(value: object) -> IdResult:
    """The id of a JSON value parsed with `parse_float=Decimal`, or None and why it has none."""
    if isinstance(value, str):
        if not value:
            return None, "is empty"
        try:
            value.encode()
        except UnicodeEncodeError:
            return None, "is not valid Unicode (a lone surrogate has no UTF-8 form)"
        return text_id(value), ""
    if isinstance(value, bool):  # before int: a bool is an int
        return None, f"is {json.dumps(value)}: a boolean cannot tell messages apart"
    if isinstance(value, int | Decimal):
        return TAG + str(value), ""
    if isinstance(value, float):  # parse_float=Decimal leaves only NaN and Infinity as floats
        return None, f"is {json.dumps(value)}, not a finite number"
    if value is None:
        return None, "is null"
    return None, "is an object or an array, not a string or a number"


def _from_key(record: Record) -> IdResult:
    if not record.key:
        return None, "no message id: the message has no key"
    return bytes_id(record.key), ""


def _from_header(record: Record, name: str) -> IdResult:
    for key, value in record.headers:
        if key == name:
            if not value:
                return None, f"no message id: header {name!r} is empty"
            return bytes_id(value), ""
    return None, f"no message id: no header {name!r}"


def _from_json(record: Record, field: str) -> IdResult:
    try:
        body = json.loads(record.value or b"", parse_float=Decimal)
    except ValueError as exc:
        return None, f"no message id: the value is not JSON ({exc})"
    if not isinstance(body, dict):
        return None, f"no message id: the value is JSON but not an object with {field!r}"
    if field not in body:
        return None, f"no message id: JSON field {field!r} is missing"
    found, why = json_id(body[field])
    if found is None:
        return None, f"no message id: JSON field {field!r} {why}"
    return found, ""
