"""Redis idempotency bolt: exactly-once effects across replays, crashes and timeouts.

`IdempotencyBolt` (bolt.py) wraps the handler that applies a message's effects; message ids
come from ids.py; the Redis layer is `IdempotencyStore` over Lua scripts in `dedup/lua/`; the
fencing tokens' epochs live in ZooKeeper (`ZkEpoch`). See ../shared/design.md, "dedup".
"""

from dedup.bolt import Effects, IdempotencyBolt
from dedup.epoch import EpochCorrupt, ZkEpoch
from dedup.store import (
    ALLOWED_EFFECTS,
    Claim,
    ClaimStatus,
    DedupError,
    Effect,
    EffectNotAllowed,
    EpochConflict,
    EpochSource,
    IdempotencyStore,
    Record,
    RecordState,
    Settlement,
    SettleStatus,
    server_durability_warnings,
)

__all__ = [
    "ALLOWED_EFFECTS",
    "Claim",
    "ClaimStatus",
    "DedupError",
    "Effect",
    "EffectNotAllowed",
    "Effects",
    "EpochConflict",
    "EpochCorrupt",
    "EpochSource",
    "IdempotencyBolt",
    "IdempotencyStore",
    "Record",
    "RecordState",
    "SettleStatus",
    "Settlement",
    "ZkEpoch",
    "server_durability_warnings",
]
