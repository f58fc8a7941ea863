"""The effects a settlement may apply with DONE: the allowlist, the check of one effect, and
which effects of a batch the settle script may apply combined (sums, field groups, merged
writes).

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
from dedup.scripts import is_own_key

MAX_EFFECT_ARGS = 1000  # arguments of one effect; settle.lua's MAX_ARGS (Lua's unpack)
INT64 = range(-(2**63), 2**63)  # increments Redis accepts
_TEXT = (str, bytes)  # isinstance with a tuple: faster than with a union, once per effect
_ARGUMENT = (str, bytes, int, float)
_ARGUMENT_TYPES = frozenset(_ARGUMENT)  # exactly these types: no per-argument isinstance needed
_BRACE = ("{", b"{")  # how a key with a hash tag starts, as str or bytes


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
    id: str, effect: Effect, tag: str | None = None, own: str | None = None
) -> tuple[str, str | bytes, list[str | bytes | int | float]]:
    """`(code, key, args)` of an allowed effect (code: its letter in settle.lua), or
    `EffectNotAllowed` saying what is wrong. With `tag` (a Redis Cluster), the effect key must
    carry that hash tag, its record's, to be in the record's slot. With `own` (the record's
    shard tag), the key may not be one of the store's own keys there: an effect would rewrite
    what dedup relies on."""
    if isinstance(effect, _TEXT) or len(effect) < 2:
        raise EffectNotAllowed(
            id, effect, f"give (command, key, args...); allowed: {_ALLOWED_TEXT}"
        )
    command, key, *args = effect
    name = command if isinstance(command, str) else ""
    spec = ALLOWED_EFFECTS.get(name) or ALLOWED_EFFECTS.get(name.upper())  # as Effects spells it
    if spec is None:
        raise EffectNotAllowed(id, effect, f"allowed commands: {_ALLOWED_TEXT}")
    code, low, high, integers, pairs = spec
    count = len(args)
    if count < low or (high is not None and count > high) or (pairs and count % 2):
        raise EffectNotAllowed(id, effect, f"wrong number of arguments; allowed: {_ALLOWED_TEXT}")
    if count > MAX_EFFECT_ARGS:
        raise EffectNotAllowed(id, effect, f"more than {MAX_EFFECT_ARGS} arguments: split it")
    if not isinstance(key, _TEXT):
        raise EffectNotAllowed(id, effect, "the key must be str or bytes")
    if not _ARGUMENT_TYPES.issuperset(map(type, args)):  # a bool, a subclass, another type
        for arg in args:
            if isinstance(arg, bool) or not isinstance(arg, _ARGUMENT):
                raise EffectNotAllowed(
                    id, effect, f"argument {arg!r} is not str, bytes, int or float"
                )
    for position in integers:
        number = args[position]
        # compared, not `in INT64`: a range walks itself for an int subclass (an IntEnum)
        if not isinstance(number, int) or not INT64.start <= number < INT64.stop:
            raise EffectNotAllowed(id, effect, f"the increment {number!r} must be a 64-bit int")
        args[position] = int(number)  # an IntEnum is sent as its number, not its repr
    if own is not None and key[:1] in _BRACE and is_own_key(key, own):
        raise EffectNotAllowed(
            id,
            effect,
            f"{text(key)} is one of the dedup store's own keys (record buckets, marks, lease "
            f"proofs, the fence): give the effect a key of its own, e.g. {{{own}}}:counts",
        )
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
    by the script as one INCRBY or HINCRBY (see `CallEffects.sums`)."""

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
    HMGET and one HSET (see `CallEffects.groups`)."""

    key: str | bytes
    fields: list[str | bytes | int | float]  # one per item, distinct as Redis sees them
    positions: list[int]  # the items, in order
    increments: list[int]  # theirs, in the same order


class MergedWrite(NamedTuple):
    """Items whose only effect is a SET, or a SADD or HSET of one key, written by the script with
    one command: an MSET of their keys, or one SADD or HSET (see `CallEffects.merged`)."""

    code: str  # "S" (one MSET of the items' keys), "A" (one SADD) or "T" (one HSET) of keys[0]
    keys: list[str | bytes]  # "S": each item's key, in order; "A", "T": the one key
    positions: list[int]  # the items, in order
    args: list[list[str | bytes | int | float]]  # each item's arguments after its key


MERGED = frozenset("SAT")  # the codes of the effects a MergedWrite may hold
# an item's only effect, a SET, SADD or HSET: (position, code, key, the key as sent, arguments)
LoneWrite = tuple[int, str, str | bytes, bytes, list[str | bytes | int | float]]


class CallEffects:
    """The checked effects of a settle call's items (a FAILED item has none), and which of them
    the script may apply combined: increments as sums (`sums`) or field groups (`groups`), and
    SETs, SADDs and HSETs as merged writes (`merged`). Built once per call."""

    def __init__(self, items: Sequence[Sequence[CheckedEffect]]) -> None:
        # the lone increments, grouped by the values given (their types too: 7 and 7.0 are sent
        # as "7" and "7.0")
        self.grouped: dict[tuple[object, ...], Sum] = {}
        self._writes: list[LoneWrite] = []  # the lone SETs, SADDs and HSETs
        self._codes: dict[bytes, set[str]] = {}  # key -> the codes of the lone effects on it
        self._shared: set[bytes] = set()  # the keys of items with several effects
        wired: dict[tuple[object, ...], tuple[str, bytes, bytes]] = {}  # name -> as Redis sees it
        for position, effects in enumerate(items):
            if len(effects) != 1:
                self._shared.update(_wire(key) for _, key, _ in effects)
                continue
            code, key, args = effects[0]
            raw = _wire(key)
            self._codes.setdefault(raw, set()).add(code)
            if code in MERGED:
                self._writes.append((position, code, key, raw, args))
                continue
            field = args[0] if code == "H" else ""
            name = (code, type(key), key, type(field), field)
            found = self.grouped.get(name)
            if found is None:
                found = self.grouped[name] = Sum(code, key, field, [], [])
                wired[name] = (code, raw, _wire(field))
            found.positions.append(position)
            found.increments.append(int(args[INCREMENTS[code]]))
        seen: dict[tuple[str, bytes, bytes], int] = {}
        for as_sent in wired.values():
            seen[as_sent] = seen.get(as_sent, 0) + 1
        # the increments of a key and field nothing else in the call writes but increments of
        # their kind, the field given one way only as Redis sees it (7 and "7" are one field):
        # (them, the key as sent)
        self._alone = [
            (found, wired[name][1])
            for name, found in self.grouped.items()
            if seen[wired[name]] == 1 and self._only(found.code, wired[name][1])
        ]

    def _only(self, code: str, raw: bytes) -> bool:
        """Whether every effect of the call on the key `raw` (as sent) is the only effect of its
        item, of `code`."""
        return raw not in self._shared and self._codes[raw] == {code}

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
            for one, _ in self._alone
            if len(one.positions) > 1
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
        for one, raw in self._alone:
            if one.code == "H" and len(one.positions) == 1:
                group = groups.setdefault(raw, FieldGroup(one.key, [], [], []))
                group.fields.append(one.field)
                group.positions.extend(one.positions)
                group.increments.extend(one.increments)
        return sorted(
            (group for group in groups.values() if len(group.positions) > 1),
            key=lambda group: group.positions[0],
        )

    def merged(self) -> list[MergedWrite]:
        """The SETs, SADDs and HSETs the call may write with one command each, in the order of each
        one's first item: every lone `SET key value` of the call as one MSET, and the lone SADDs
        (HSETs) of one key as one SADD (HSET). A result per id (`SET result:<id> v`) then costs
        its key and value, not a command per item. An item's write joins when it is the item's
        only effect and every effect of the call on its key is a lone one of the same command:
        nothing else then sees the key between the items, so one command leaves what each item's
        own would (the last value of a key or field set twice). Where Redis refuses it (a key
        of another type), the script applies the items one by one instead, in item order, so
        the same items are refused. A merged write has two items at least."""
        sets = MergedWrite("S", [], [], [])
        merged: dict[bytes, MergedWrite] = {}
        for position, code, key, raw, args in self._writes:
            if not self._only(code, raw):
                continue
            if code == "S":
                merge = sets
                merge.keys.append(key)
            else:
                merge = merged.setdefault(raw, MergedWrite(code, [key], [], []))
            merge.positions.append(position)
            merge.args.append(args)
        return sorted(
            (merge for merge in (sets, *merged.values()) if len(merge.positions) > 1),
            key=lambda merge: merge.positions[0],
        )


def _wire(value: str | bytes | int | float) -> bytes:
    """`value` as the Redis client sends it (so equal sums compare equal)."""
    if type(value) is str:  # the usual key: before the isinstance checks
        return value.encode()
    if isinstance(value, bytes):
        return value
    if isinstance(value, float):
        return repr(value).encode()
    return str(value).encode()
