"""Pure logic of dedup.store: effect validation, record decoding, constructor checks (no server:
a redis.Redis client connects only on its first command)."""

from __future__ import annotations

import pytest
import redis

from dedup import Claim, ClaimStatus, EffectNotAllowed, IdempotencyStore, Record, RecordState
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


FIRST = (3 << 40) + 7  # the counter before a claim call's first token


@pytest.mark.parametrize("codes", [b"1", b"1,1,1", "1,1,1"])
def test_claim_codes_of_all_new_ids_decode_to_consecutive_tokens(codes: bytes | str) -> None:
    n = (len(codes) + 1) // 2
    claims = IdempotencyStore._claims(FIRST, codes, [], n)

    expected = [Claim(ClaimStatus.CLAIMED, FIRST + k, 1, 0) for k in range(1, n + 1)]
    assert claims == expected
    assert all(type(claim) is Claim for claim in claims)
    assert claims[0].status is ClaimStatus.CLAIMED and claims[-1].token == FIRST + n


@pytest.mark.parametrize(
    ("codes", "n"),
    [(b"1,11,0,-250,1", 5), (b"11", 1), (b"1,0", 2), (b"0,1,1", 3), (b"r,1,0,r,2", 5)],
)
def test_claim_codes_decode_by_code_when_not_all_new(codes: bytes, n: int) -> None:
    reasons: list[bytes | str] = [b"why 1", "why 2"]
    claims = IdempotencyStore._claims(FIRST, codes, reasons[: codes.count(b"r")], n)

    expected: list[Claim] = []
    errors = iter(["why 1", "why 2"])
    for position, code in enumerate(codes.split(b","), start=1):
        if code == b"r":
            expected.append(Claim(ClaimStatus.REJECTED, 0, 0, 0, next(errors)))
        elif int(code) > 0:  # the token is the id's position, whatever the others got
            expected.append(Claim(ClaimStatus.CLAIMED, FIRST + position, int(code), 0))
        elif int(code) == 0:
            expected.append(Claim(ClaimStatus.DUPLICATE, 0, 0, 0))
        else:
            expected.append(Claim(ClaimStatus.DEFERRED, 0, 0, -int(code)))
    assert claims == expected
    assert all(type(claim) is Claim and len(claim) == len(Claim._fields) for claim in claims)


@pytest.mark.parametrize(
    ("effect", "why"),
    [
        (("INCRBY", "k", 2**63), "64-bit"),
        (("HINCRBY", "k", "f", -(2**63) - 1), "64-bit"),
        (("SADD", "k", *range(1001)), "more than 1000"),
    ],
)
def test_effects_redis_would_refuse_for_their_arguments_alone_are_refused_here(
    effect: tuple[str | int, ...], why: str
) -> None:
    with pytest.raises(EffectNotAllowed, match=why):
        check_effect("m", effect)
    assert check_effect("m", ("INCRBY", "k", 2**63 - 1)) == ("I", "k", [2**63 - 1])
