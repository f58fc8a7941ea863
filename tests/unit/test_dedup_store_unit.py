"""Pure logic of dedup.store: effect validation, record decoding, constructor checks (no server:
a redis.Redis client connects only on its first command)."""

from __future__ import annotations

import pytest
import redis

from dedup import EffectNotAllowed, IdempotencyStore, Record, RecordState
from dedup.store import check_effect


class FixedEpoch:
    def current(self) -> int:
        return 1

    def bump(self, seen: int) -> int:
        return seen + 1


def test_allowed_effects_are_normalised() -> None:
    assert check_effect("m", ("hincrby", "k", "f", -2)) == ("H", "k", ["f", -2])
    assert check_effect("m", ["SADD", b"k", "a", 1.5]) == ("A", b"k", ["a", 1.5])
    assert check_effect("m", ("HSET", "k", "f1", "v1", "f2", 2)) == (
        "T",
        "k",
        ["f1", "v1", "f2", 2],
    )


def test_a_refused_effect_names_the_message_and_what_is_allowed() -> None:
    with pytest.raises(EffectNotAllowed) as raised:
        check_effect("msg-7", ("DEL", "k"))
    assert raised.value.id == "msg-7"
    assert "INCRBY key n" in str(raised.value)


def test_records_decode_with_colons_in_owner_and_error() -> None:
    assert Record.decode(b"I:1000000002a:3:1700000000123:host:42") == Record(
        RecordState.IN_FLIGHT, (1 << 40) + 42, 3, "host:42", 1700000000123
    )
    assert Record.decode(b"D:20000000001:1") == Record(RecordState.DONE, (2 << 40) + 1, 1)
    assert Record.decode(b"F:10000000001:2:KeyError: 'a:b'") == Record(
        RecordState.FAILED, (1 << 40) + 1, 2, error="KeyError: 'a:b'"
    )


@pytest.mark.parametrize(
    ("namespace", "lease_ms", "done_ttl_ms"),
    [("", 1, 1), ("a{b}", 1, 1), ("ns", 0, 1), ("ns", 1, -5)],
)
def test_the_constructor_refuses_bad_settings(
    namespace: str, lease_ms: int, done_ttl_ms: int
) -> None:
    with pytest.raises(ValueError):
        IdempotencyStore(
            redis.Redis(),
            namespace=namespace,
            lease_ms=lease_ms,
            done_ttl_ms=done_ttl_ms,
            epoch_source=FixedEpoch(),
        )
