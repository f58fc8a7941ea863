"""Counts agree in number with their noun (`kspout.wording`)."""

from __future__ import annotations

from kspout.wording import count, yes_no


def test_a_count_agrees_in_number_with_its_noun() -> None:
    assert [count(n, "partition") for n in (0, 1, 2)] == [
        "0 partitions",
        "1 partition",
        "2 partitions",
    ]
    assert count(1, "dead letter") == "1 dead letter"
    assert count(3, "batch") == "3 batches"


def test_flags_are_words() -> None:
    assert (yes_no(True), yes_no(False)) == ("yes", "no")
