"""dedup.effects.CallEffects (sums, field groups, merged writes): which increments of a batch the
settle script may apply as one sum, which as one HMGET and one HSET of a hash's fields, and which
SETs, SADDs and HSETs as one command.

Pure logic over checked effects; what Redis then holds is in
tests/integration/test_dedup_store.py and test_dedup_sums_props.py.
"""

from __future__ import annotations

from dedup.effects import CallEffects, CheckedEffect

MAX = 2**63 - 1
Summed = tuple[str, str | bytes, str | bytes | int | float, list[int], int]


def sums(items: list[list[CheckedEffect]]) -> list[Summed]:
    """CallEffects.sums as (code, key, field, positions, total)."""
    return [(c.code, c.key, c.field, c.positions, c.total) for c in CallEffects(items).sums()]


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
    """CallEffects.groups as (key, fields, positions, increments)."""
    return [(g.key, g.fields, g.positions, g.increments) for g in CallEffects(items).groups()]


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


Merged = tuple[str, list[str | bytes], list[int], list[list[str | bytes | int | float]]]


def merged(items: list[list[CheckedEffect]]) -> list[Merged]:
    """CallEffects.merged as (code, keys, positions, args)."""
    return [(m.code, m.keys, m.positions, m.args) for m in CallEffects(items).merged()]


def set_(key: str, value: str) -> list[CheckedEffect]:
    return [("S", key, [value])]


def sadd(key: str, *members: str) -> list[CheckedEffect]:
    return [("A", key, list(members))]


def test_lone_sets_of_any_keys_are_one_mset_and_a_keys_sadds_one_sadd() -> None:
    items = [set_("r1", "a"), sadd("s", "x", "y"), incr("n", 1), set_("r2", "b"), sadd("s", "z")]
    assert merged(items) == [
        ("S", ["r1", "r2"], [0, 3], [["a"], ["b"]]),
        ("A", ["s"], [1, 4], [["x", "y"], ["z"]]),
    ]


def test_a_key_set_twice_is_merged_and_the_last_value_wins_in_item_order() -> None:
    items = [set_("r", "a"), [("T", "h", ["f", "1"])], set_("r", "b"), [("T", "h", ["f", "2"])]]
    assert merged(items) == [
        ("S", ["r", "r"], [0, 2], [["a"], ["b"]]),
        ("T", ["h"], [1, 3], [["f", "1"], ["f", "2"]]),
    ]


def test_a_write_whose_key_another_effect_touches_is_left_to_its_item() -> None:
    # an INCRBY of r2, an item with two effects on s, a SADD and a SET of one key
    items = [set_("r1", "a"), set_("r2", "b"), incr("r2", 1), set_("r3", "c")]
    assert merged(items) == [("S", ["r1", "r3"], [0, 3], [["a"], ["c"]])]
    both: list[CheckedEffect] = [("A", "s", ["x"]), ("I", "n", [1])]
    assert merged([sadd("s", "y"), both, sadd("s", "z")]) == []
    assert merged([sadd("k", "y"), set_("k", "v"), sadd("k", "z")]) == []
    assert merged([set_("k", "v"), set_(b"k", "w")]) == [  # one key as Redis sees it
        ("S", ["k", b"k"], [0, 1], [["v"], ["w"]])
    ]


def test_a_lone_write_is_left_to_its_item() -> None:
    assert merged([set_("r1", "a"), sadd("s", "x"), incr("n", 1)]) == []
