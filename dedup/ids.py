"""Message ids for the dedup bolt: from the key, a header, or a top-level JSON field.

The source is the topic config's `[dedup] id_source`. A message without an id cannot be
deduplicated; the bolt sends it to the dead-letter topic with the reason this module gives.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from kspout.kafka import Record

IdResult = tuple[str | None, str]  # (id, or None and why not)
IdReader = Callable[[Record], IdResult]


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


def _text(raw: bytes | None) -> str | None:
    if not raw:
        return None
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return "x:" + raw.hex()  # stable, and unlike any text id (those cannot hold b"x:")


def _from_key(record: Record) -> IdResult:
    found = _text(record.key)
    return (found, "") if found else (None, "no message id: the message has no key")


def _from_header(record: Record, name: str) -> IdResult:
    for key, value in record.headers:
        if key == name:
            found = _text(value)
            if found:
                return found, ""
            return None, f"no message id: header {name!r} is empty"
    return None, f"no message id: no header {name!r}"


def _from_json(record: Record, field: str) -> IdResult:
    try:
        body: Any = json.loads(record.value or b"")
    except ValueError as exc:
        return None, f"no message id: the value is not JSON ({exc})"
    if not isinstance(body, dict):
        return None, f"no message id: the value is JSON but not an object with {field!r}"
    value = body.get(field)
    if value is None or value == "" or isinstance(value, dict | list):
        return None, f"no message id: JSON field {field!r} is missing, empty or not a scalar"
    return str(value), ""
