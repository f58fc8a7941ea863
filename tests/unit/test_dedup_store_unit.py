"""Pure logic of the dedup store: effects (dedup.effects), records and replies (dedup.records),
constructor checks (no server: a redis.Redis client connects only on its first command)."""

from __future__ import annotations

import enum

import pytest
import redis

from dedup import EffectNotAllowed, IdempotencyStore, IdRecord, IdRecordState, Lease, LeaseStatus
from dedup.effects import check_effect, hash_tag
from dedup.records import LeaseRun, decode_lease_runs, expand, remap_runs


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


def test_an_int_subclass_increment_is_checked_at_once_and_sent_as_its_number() -> None:
    class Step(enum.IntEnum):
        ONE = 1

    # `Step.ONE in range(...)` walks the range; the check compares instead
    [increment] = check_effect("m", ("INCRBY", "k", Step.ONE))[2]
    assert type(increment) is int and increment == 1
    with pytest.raises(EffectNotAllowed, match="not str, bytes, int or float"):
        check_effect("m", ("INCRBY", "k", True))  # a bool is an int too, and refused


def test_a_refused_effect_names_the_message_and_what_is_allowed() -> None:
    with pytest.raises(EffectNotAllowed) as raised:
        check_effect("msg-7", ("DEL", "k"))
    assert raised.value.id == "msg-7"
    assert "INCRBY key n" in str(raised.value)


def test_records_decode_with_colons_in_owner_and_error() -> None:
    assert IdRecord.decode(b"I:1000000002a:3:1700000000123:1000:host:42") == IdRecord(
        IdRecordState.IN_FLIGHT, (1 << 40) + 42, 3, "host:42", 1700000000123
    )
    assert IdRecord.decode(b"D:20000000001:1") == IdRecord(IdRecordState.DONE, (2 << 40) + 1, 1)
    assert IdRecord.decode(b"F:10000000001:2:KeyError: 'a:b'") == IdRecord(
        IdRecordState.FAILED, (1 << 40) + 1, 2, error="KeyError: 'a:b'"
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


FIRST = (3 << 40) + 7  # the counter before a lease call's first token


@pytest.mark.parametrize("runs", [b"1:1", b"1:3", "1:1000"])
def test_a_batch_of_new_ids_is_one_run_of_one_token(runs: bytes | str) -> None:
    n = int(runs[2:])
    [run] = decode_lease_runs(FIRST, runs, [])

    assert run == LeaseRun(LeaseStatus.LEASED, 0, n, FIRST + 1, 1, 0)
    leases = expand([run])
    assert leases == [Lease(LeaseStatus.LEASED, FIRST + 1, 1, 0)] * n
    assert all(type(lease) is Lease for lease in leases)


@pytest.mark.parametrize(
    "runs",
    [b"1:1,11:1,0:1,-250:1,1:1", b"11:1", b"1:1,0:1", b"0:1,1:2", b"r:1,1:1,0:1,r:1,2:1", b"0:5"],
)
def test_lease_runs_decode_to_one_lease_per_id_in_order(runs: bytes) -> None:
    reasons: list[bytes | str] = [b"why 1", "why 2"]
    leases = expand(decode_lease_runs(FIRST, runs, reasons[: runs.count(b"r")]))

    expected: list[Lease] = []
    errors = iter(["why 1", "why 2"])
    for part in runs.split(b","):
        code, count = part.split(b":")
        for _ in range(int(count)):
            if code == b"r":
                expected.append(Lease(LeaseStatus.REJECTED, 0, 0, 0, next(errors)))
            elif int(code) > 0:
                expected.append(Lease(LeaseStatus.LEASED, FIRST + 1, int(code), 0))
            elif int(code) == 0:
                expected.append(Lease(LeaseStatus.DUPLICATE, 0, 0, 0))
            else:
                expected.append(Lease(LeaseStatus.DEFERRED, 0, 0, -int(code)))
    assert leases == expected
    assert all(type(lease) is Lease and len(lease) == len(Lease._fields) for lease in leases)


def test_duplicates_and_deferred_ids_come_back_as_counted_runs() -> None:
    runs = decode_lease_runs(FIRST, b"0:700,-90:200,1:99,r:1", [b"WRONGTYPE"])

    assert [(r.status, r.start, r.length) for r in runs] == [
        (LeaseStatus.DUPLICATE, 0, 700),
        (LeaseStatus.DEFERRED, 700, 200),
        (LeaseStatus.LEASED, 900, 99),
        (LeaseStatus.REJECTED, 999, 1),
    ]
    assert runs[1].retry_after_ms == 90 and runs[2].token == FIRST + 1
    assert runs[3].errors == ("WRONGTYPE",)


def test_runs_of_one_shard_map_back_to_the_positions_of_its_ids_in_the_call() -> None:
    # the shard's 5 ids were at positions 0, 1, 4, 5, 6 of the call; 2 and 3 were elsewhere
    runs = decode_lease_runs(FIRST, b"1:3,r:2", [b"a", b"b"])

    mapped = remap_runs(runs, [0, 1, 4, 5, 6])

    assert mapped == [
        LeaseRun(LeaseStatus.LEASED, 0, 2, FIRST + 1, 1, 0),
        LeaseRun(LeaseStatus.LEASED, 4, 1, FIRST + 1, 1, 0),
        LeaseRun(LeaseStatus.REJECTED, 5, 2, 0, 0, 0, ("a", "b")),
    ]


@pytest.mark.parametrize(
    ("key", "tag"),
    [("{ns:p3}:revenue", b"ns:p3"), (b"x{ns:p3}y{z}", b"ns:p3"), ("{}ns", None), ("plain", None)],
)
def test_hash_tags_are_read_as_redis_cluster_reads_them(
    key: str | bytes, tag: bytes | None
) -> None:
    assert hash_tag(key) == tag


def test_an_effect_on_one_of_the_stores_own_keys_is_refused() -> None:
    for key in ("{ns}:ids:3", "{ns}:done:1a", b"{ns}:lease:1a", "{ns}:fence"):
        with pytest.raises(EffectNotAllowed, match="one of the dedup store's own keys"):
            check_effect("m", ("SET", key, "x"), None, "ns")
    for key in ("{ns}:leases", "{other}:ids:3", "ns:ids:3", "{ns}:counts"):  # not the store's
        assert check_effect("m", ("SET", key, "x"), None, "ns") == ("S", key, ["x"])


def test_on_a_cluster_an_effect_key_without_its_records_hash_tag_is_refused() -> None:
    assert check_effect("m", ("INCRBY", "{ns:p3}:n", 1), "ns:p3") == ("I", "{ns:p3}:n", [1])
    assert check_effect("m", ("INCRBY", "n", 1)) == ("I", "n", [1])  # one server: any key
    for key in ("n", "{ns:p4}:n", "{ns}:n"):
        with pytest.raises(EffectNotAllowed, match=r"must carry its record's hash tag \{ns:p3\}"):
            check_effect("m", ("INCRBY", key, 1), "ns:p3")


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
