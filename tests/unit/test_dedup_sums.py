"""dedup.effects.Increments (sums and groups): which increments of a batch the settle script may
apply as one sum, and which as one HMGET and one HSET of a hash's fields.

Pure logic over checked effects; what Redis then holds is in
tests/integration/test_dedup_store.py and test_dedup_sums_props.py.
"""

from __future__ import annotations

from dedup.effects import CheckedEffect, Increments

MAX = 2**63 - 1
Summed = tuple[str, str | bytes, str | bytes | int | float, list[int], int]


def sums(items: list[list[CheckedEffect]]) -> list[Summed]:
    """Increments.sums as (code, key, field, positions, total)."""
    return [(c.code, c.key, c.field, c.positions, c.total) for c in Increments(items).sums()]


def hincr(key: str, field: str | int, n: int) -> list[CheckedEffect]:
    return [("H", key, [field, n])]


def incr(key: str, n: int) -> list[CheckedEffect]:
    return [("I", key, [n])]


def test_a_sum_two_items_increment_is_summed_in_the_order_of_its_first_item() -> None:
    items = [hincr("w", "b", 1), incr("n", 2), hincr("w", "a", 1), hincr("w", "b", 3), incr("n", 5)]
    assert sums(items) == [("H", "w", "b", [0, 3], 4), ("I", "n", "", [1, 4], 7)]


def test_one_sum_given_as_int_and_as_text_is_left_to_its_items() -> None:
    # Redis sees one field "7"; applied one by one, the increments leave what a sum would
    assert sums([hincr("w", 7, 1), hincr("w", "7", 1), hincr("w", 7, 1)]) == []
    assert sums([hincr("w", 7, 1), hincr("w", 7.0, 1), hincr("w", 7, 1)]) == [
        ("H", "w", 7, [0, 2], 2)
    ]


def test_a_lone_increment_or_a_failed_item_is_not_summed() -> None:
    assert sums([hincr("w", "a", 1), [], hincr("w", "b", 1)]) == []


def test_an_item_with_several_effects_keeps_them_whole_and_its_keys_unsummed() -> None:
    both: list[CheckedEffect] = [("I", "n", [1]), ("S", "v", ["x"])]
    assert sums([incr("n", 1), both, incr("n", 1)]) == []


def test_a_key_another_effect_writes_is_not_summed() -> None:
    assert sums([incr("n", 1), [("S", "n", ["x"])], incr("n", 1)]) == []
    # an INCRBY and an HINCRBY of one key: which comes first decides which is refused
    assert sums([incr("k", 1), incr("k", 1), hincr("k", "f", 1), hincr("k", "f", 1)]) == []


def test_increments_of_both_signs_or_a_sum_past_64_bits_are_applied_one_by_one() -> None:
    assert sums([incr("n", 5), incr("n", -5)]) == []
    assert sums([incr("n", MAX), incr("n", 1)]) == []
    assert sums([incr("n", -3), incr("n", 0), incr("n", -4)]) == [("I", "n", "", [0, 1, 2], -7)]


Grouped = tuple[str | bytes, list[str | bytes | int | float], list[int], list[int]]


def groups(items: list[list[CheckedEffect]]) -> list[Grouped]:
    """Increments.groups as (key, fields, positions, increments)."""
    return [(g.key, g.fields, g.positions, g.increments) for g in Increments(items).groups()]


def test_counters_of_distinct_fields_of_one_hash_are_one_group_per_key() -> None:
    items = [hincr("a", "x", 1), hincr("b", "x", 2), incr("n", 1), hincr("a", "y", -3)]
    assert groups(items) == [("a", ["x", "y"], [0, 3], [1, -3])]  # "b" has one item only


def test_a_field_two_items_increment_is_a_sum_and_stays_out_of_its_keys_group() -> None:
    items = [hincr("a", "x", 1), hincr("a", "y", 1), hincr("a", "x", 1), hincr("a", "z", 1)]
    assert sums(items) == [("H", "a", "x", [0, 2], 2)]
    assert groups(items) == [("a", ["y", "z"], [1, 3], [1, 1])]


def test_a_hash_another_effect_writes_or_a_field_given_two_ways_is_not_grouped() -> None:
    both: list[CheckedEffect] = [("H", "a", ["x", 1]), ("S", "v", ["x"])]
    assert groups([hincr("a", "y", 1), both, hincr("a", "z", 1)]) == []
    assert groups([hincr("a", 7, 1), hincr("a", "7", 1)]) == []  # one field as Redis sees it
    assert groups([hincr("a", "y", 1), [("T", "a", ["w", "v"])], hincr("a", "z", 1)]) == []
