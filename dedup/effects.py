"""The effects a settlement may apply with DONE: the allowlist, the check of one effect, and
which increments of a batch may be applied as one sum.

Effects atomic with DONE run in the settle script, so on a cluster their keys must be in the
record's slot: the rule is that an effect key carries its record's hash tag
(`IdempotencyStore.effect_key(name, partition)` makes one, e.g. `{orders:p3}:revenue`); other
keys are refused with `EffectNotAllowed` before anything is sent. On one server any key is
allowed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from dedup.errors import EffectNotAllowed
from dedup.records import Effect, text

MAX_EFFECT_ARGS = 1000  # arguments of one effect; settle.lua's MAX_ARGS (Lua's unpack)
INT64 = range(-(2**63), 2**63)  # increments Redis accepts
_TEXT = (str, bytes)  # isinstance with a tuple: faster than with a union, once per effect
_ARGUMENT = (str, bytes, int, float)


class _EffectSpec(NamedTuple):
    code: str  # the command's letter in settle.lua's effect shapes
    low: int  # fewest arguments after the key
    high: int | None  # most arguments after the key (None: no limit)
    integers: tuple[int, ...]  # positions of arguments that must be ints
    pairs: bool  # arguments come in pairs


ALLOWED_EFFECTS: dict[str, _EffectSpec] = {
    "SET": _EffectSpec("S", 1, 1, (), False),  # SET key value
    "INCRBY": _EffectSpec("I", 1, 1, (0,), False),  # INCRBY key increment
    "HINCRBY": _EffectSpec("H", 2, 2, (1,), False),  # HINCRBY key field increment
    "SADD": _EffectSpec("A", 1, None, (), False),  # SADD key member [member ...]
    "HSET": _EffectSpec("T", 2, None, (), True),  # HSET key field value [field value ...]
}
_ALLOWED_TEXT = (
    "SET key value, INCRBY key n, HINCRBY key field n, SADD key member..., HSET key field value..."
)


def hash_tag(key: str | bytes) -> bytes | None:
    """The part of `key` Redis Cluster hashes to pick its slot (between the first `{` and the
    next `}`, if not empty), or None if it has none and the whole key is hashed."""
    raw = key.encode() if isinstance(key, str) else key
    start = raw.find(b"{")
    end = raw.find(b"}", start + 1)
    if start < 0 or end <= start + 1:
        return None
    return raw[start + 1 : end]


def check_effect(
    id: str, effect: Effect, tag: str | None = None
) -> tuple[str, str | bytes, list[str | bytes | int | float]]:
    """`(code, key, args)` of an allowed effect (code: its letter in settle.lua), or
    `EffectNotAllowed` saying what is wrong. With `tag` (a Redis Cluster), the effect key must
    carry that hash tag, its record's, to be in the record's slot."""
    if isinstance(effect, _TEXT) or len(effect) < 2:
        raise EffectNotAllowed(
            id, effect, f"give (command, key, args...); allowed: {_ALLOWED_TEXT}"
        )
    command, key, *args = effect
    name = command.upper() if isinstance(command, str) else ""
    spec = ALLOWED_EFFECTS.get(name)
    if spec is None:
        raise EffectNotAllowed(id, effect, f"allowed commands: {_ALLOWED_TEXT}")
    code, low, high, integers, pairs = spec
    if len(args) < low or (high is not None and len(args) > high) or (pairs and len(args) % 2):
        raise EffectNotAllowed(id, effect, f"wrong number of arguments; allowed: {_ALLOWED_TEXT}")
    if len(args) > MAX_EFFECT_ARGS:
        raise EffectNotAllowed(id, effect, f"more than {MAX_EFFECT_ARGS} arguments: split it")
    if not isinstance(key, _TEXT):
        raise EffectNotAllowed(id, effect, "the key must be str or bytes")
    for position, arg in enumerate(args):
        if isinstance(arg, bool) or not isinstance(arg, _ARGUMENT):
            raise EffectNotAllowed(id, effect, f"argument {arg!r} is not str, bytes, int or float")
        if position in integers and (not isinstance(arg, int) or arg not in INT64):
            raise EffectNotAllowed(id, effect, f"the increment {arg!r} must be a 64-bit int")
    if tag is not None and hash_tag(key) != tag.encode():
        raise EffectNotAllowed(
            id,
            effect,
            f"on a Redis Cluster an effect key must carry its record's hash tag {{{tag}}}, so "
            f"that it is written atomically with the record (Effects.key(name) makes one, "
            f"e.g. {{{tag}}}:{text(key)})",
        )
    return code, key, args


CheckedEffect = tuple[str, str | bytes, list[str | bytes | int | float]]  # check_effect's answer
INCREMENTS = {"I": 0, "H": 1}  # code -> position of the increment among the arguments


class Sum(NamedTuple):
    """The increments of one key (and field) that several items of a settle call add, applied
    by the script as one INCRBY or HINCRBY (see `Increments.sums`)."""

    code: str  # "I" (INCRBY key) or "H" (HINCRBY key field)
    key: str | bytes
    field: str | bytes | int | float  # "" for INCRBY
    positions: list[int]  # its items, in order
    increments: list[int]  # theirs, in the same order

    @property
    def total(self) -> int:
        return sum(self.increments)


class FieldGroup(NamedTuple):
    """Increments of distinct fields of one hash, one item each, applied by the script with one
    HMGET and one HSET (see `Increments.groups`)."""

    key: str | bytes
    fields: list[str | bytes | int | float]  # one per item, distinct as Redis sees them
    positions: list[int]  # the items, in order
    increments: list[int]  # theirs, in the same order


class Increments:
    """The single-effect increments of a settle call's items (each item's checked effects; a
    FAILED item has none), by key and field as given, and what else the call writes: which of
    them the script may apply as sums (`sums`) or as field groups (`groups`). Built once per
    call."""

    def __init__(self, items: Sequence[Sequence[CheckedEffect]]) -> None:
        # grouped by the values given (their types too: 7 and 7.0 are sent as "7" and "7.0")
        self.grouped: dict[tuple[object, ...], Sum] = {}
        other_keys: set[tuple[type, str | bytes]] = set()  # keys of effects that are no increment
        for position, effects in enumerate(items):
            if len(effects) == 1 and effects[0][0] in INCREMENTS:
                code, key, args = effects[0]
                field = args[0] if code == "H" else ""
                name = (code, type(key), key, type(field), field)
                found = self.grouped.get(name)
                if found is None:
                    found = self.grouped[name] = Sum(code, key, field, [], [])
                found.positions.append(position)
                found.increments.append(int(args[INCREMENTS[code]]))
            else:
                other_keys.update((type(key), key) for _, key, _ in effects)
        self._others = {_wire(key) for _, key in other_keys}
        self._seen: dict[tuple[str, bytes, bytes], int] = {}
        self._kinds: dict[bytes, set[str]] = {}
        for found in self.grouped.values():
            wired = (found.code, _wire(found.key), _wire(found.field))
            self._seen[wired] = self._seen.get(wired, 0) + 1
            self._kinds.setdefault(wired[1], set()).add(found.code)

    def alone(self, found: Sum) -> bool:
        """Whether nothing else in the call writes `found`'s key but increments of its kind, and
        its field is given one way only as Redis sees it (7 and "7" are one field)."""
        raw = _wire(found.key)
        return (
            raw not in self._others
            and len(self._kinds[raw]) == 1
            and self._seen[(found.code, raw, _wire(found.field))] == 1
        )

    def sums(self) -> list[Sum]:
        """The increments the call may apply as sums, one per key (and field), in the order of
        each one's first item.

        A batch of word counts or totals increments a few counters many times; one INCRBY or
        HINCRBY per counter, in the same settle script, leaves what one per item would, when:

        * the item's only effect is the increment (an item's effects apply whole or not at all);
        * at least two items increment that key (and field, for HINCRBY);
        * no other effect of the batch touches the key (applied after the items' own writes, a
          sum must not pass a SET of the key, nor an INCRBY pass an HINCRBY);
        * the increments have one sign and their total is a 64-bit integer. Then the running value
          only moves one way, so the total overflows exactly when applying them one by one would,
          and the script applies them one by one then, to refuse the very items Redis would.
        """
        return [
            one
            for one in self.grouped.values()
            if len(one.positions) > 1
            and self.alone(one)
            and one.total in INT64
            and (min(one.increments) >= 0 or max(one.increments) <= 0)
        ]

    def groups(self) -> list[FieldGroup]:
        """The HINCRBYs the call may apply per hash, one group per key, in the order of each one's
        first item: a counter per id (`HINCRBY applied <id> 1`) is one HMGET and one HSET of the
        batch's fields instead of a command per item. The script adds in Lua, exactly, and falls
        back to one HINCRBY per item, in item order, where Redis would refuse one (a value that is
        no integer, an overflow, a key of another type), so the same items are refused. An item's
        increment joins its key's group when it is the item's only effect, no other item increments
        that field (those are sums, or one by one), and no effect of the batch but HINCRBYs touches
        the key. A group has two items at least."""
        groups: dict[bytes, FieldGroup] = {}
        for one in self.grouped.values():
            if one.code == "H" and len(one.positions) == 1 and self.alone(one):
                group = groups.setdefault(_wire(one.key), FieldGroup(one.key, [], [], []))
                group.fields.append(one.field)
                group.positions.extend(one.positions)
                group.increments.extend(one.increments)
        return sorted(
            (group for group in groups.values() if len(group.positions) > 1),
            key=lambda group: group.positions[0],
        )


def _wire(value: str | bytes | int | float) -> bytes:
    """`value` as the Redis client sends it (so equal sums compare equal)."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, float):
        return repr(value).encode()
    return str(value).encode()
