"""The Lua scripts in `dedup/lua/`, by name, and the statuses and codes their replies carry.

Each script's header documents its KEYS, ARGV and reply, naming the constants below; this module
is the Python side of those names, so no caller reads a bare number out of a reply. Pure: no
Redis here (`dedup.wire` sends the scripts).
"""

from __future__ import annotations

import enum
from hashlib import sha1
from importlib.resources import files
from typing import NamedTuple


class Script(NamedTuple):
    """A Lua script and its SHA1, the name EVALSHA runs it by."""

    text: str
    sha: str


def _script(name: str, *, after: str | None = None) -> Script:
    """The script `dedup/lua/<name>`; `after`: a script of functions it uses, put in front."""
    lua = files("dedup").joinpath("lua")
    parts = [after, name] if after else [name]
    text = "\n".join(lua.joinpath(part).read_text(encoding="utf-8") for part in parts)
    return Script(text, sha1(text.encode()).hexdigest())


# lease a batch of one shard's ids: {status, base, runs, reasons}
LEASE = _script("lease.lua", after="buckets.lua")
ADVANCE_EPOCH = _script("advance_epoch.lua")  # move a shard's fence on: the fence's epoch after
SETTLE = _script("settle.lua", after="buckets.lua")  # settle a batch of one shard's ids
SHARD_TAGS = _script("shard_tags.lua")  # fix partitions' hash tags on a cluster: their tags


# The keys the scripts keep under a shard's hash tag, `{<tag>}:<name>` (dedup/lua/buckets.lua)
FENCE = "fence"  # the fence hash: epoch, counter, bucket width, keep
BUCKETS = "ids:"  # + k: bucket k of the shard's records
MARKS = "done:"  # + token hex: a lease call settled DONE whole
PROOFS = "lease:"  # + token hex: a lease call's proof that its records are untouched


def fence_key(tag: str) -> str:
    """The fence hash of the shard with hash tag `tag`."""
    return f"{{{tag}}}:{FENCE}"


def is_own_key(key: str | bytes, tag: str) -> bool:
    """Whether `key` is one of the scripts' keys under shard tag `tag`."""
    name = key if isinstance(key, str) else key.decode("utf-8", "replace")
    prefix = "{" + tag + "}:"
    if not name.startswith(prefix):
        return False
    rest = name[len(prefix) :]
    return rest == FENCE or rest.startswith((BUCKETS, MARKS, PROOFS))


class LeaseScriptStatus(enum.IntEnum):
    """The first element of `LEASE`'s reply: whether it leased, or why it changed nothing."""

    LEASED = 0  # the ids were answered: base, runs and reasons follow
    FENCE_MISSING = 1  # no fence: Redis lost data, or the shard is new
    EPOCH_MISMATCH = 2  # the fence holds another epoch, returned in place of base
    COUNTER_USED_UP = 3  # the counter would pass 2**40: a new epoch is needed


# `LEASE`'s runs are `<code>:<count>` joined by ',': code n > 0 LEASED at attempt n, 0
# DUPLICATE, -m DEFERRED (m: the longest wait of the run, ms), or this one, REJECTED
REJECTED_RUN = "r"


class SettleCode(enum.IntEnum):
    """One item's digit in `SETTLE`'s reply (the reply has none when every item settled); the
    names are `dedup.records.SettleStatus`'s."""

    SETTLED = 0  # DONE (effects applied) or FAILED
    STALE = 1  # another token holds the record, or it is already settled
    LOST = 2  # no record: it expired, or Redis lost it
    REJECTED = 3  # an effect Redis would refuse: the record is FAILED with why
