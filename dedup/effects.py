"""The effects a settlement may apply with DONE: the allowlist, and the check of one effect.

Effects atomic with DONE run in the settle script, so on a cluster their keys must be in the
record's slot: the rule is that an effect key carries its record's hash tag
(`IdempotencyStore.effect_key(name, partition)` makes one, e.g. `{orders:p3}:revenue`); other
keys are refused with `EffectNotAllowed` before anything is sent. On one server any key is
allowed.
"""

from __future__ import annotations

from typing import NamedTuple

from dedup.errors import EffectNotAllowed
from dedup.records import Effect, text

MAX_EFFECT_ARGS = 1000  # arguments of one effect; settle.lua's MAX_ARGS (Lua's unpack)
INT64 = range(-(2**63), 2**63)  # increments Redis accepts


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
    if isinstance(effect, str | bytes) or len(effect) < 2:
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
    if not isinstance(key, str | bytes):
        raise EffectNotAllowed(id, effect, "the key must be str or bytes")
    for position, arg in enumerate(args):
        if isinstance(arg, bool) or not isinstance(arg, str | bytes | int | float):
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
