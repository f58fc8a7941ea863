"""Words for people: a count and its noun agreeing in number (`1 partition`, `4 partitions`),
and yes/no for a flag, so that messages and tables never print `1 partitions` or `True`."""

from __future__ import annotations

SIBILANT = ("s", "x", "z", "ch", "sh")  # nouns that take -es: batch -> batches


def plural(noun: str) -> str:
    """The regular English plural of `noun` (every noun kspout counts is regular)."""
    return noun + ("es" if noun.endswith(SIBILANT) else "s")


def count(n: int, noun: str) -> str:
    """`n` and `noun`, in the number `n` asks for: `1 partition`, `0 partitions`."""
    return f"{n} {noun if n == 1 else plural(noun)}"


def yes_no(flag: bool) -> str:
    """`yes` or `no`: a flag as a table cell."""
    return "yes" if flag else "no"
