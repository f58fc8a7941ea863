"""Redis idempotency bolt: exactly-once effects across replays, crashes and timeouts.

`IdempotencyBolt` (bolt.py) wraps the handler that applies a message's effects; message ids
come from ids.py; the Redis layer is `IdempotencyStore` over Lua scripts in `dedup/lua/`, on
one Redis server or a Redis Cluster (records sharded per Kafka partition); the fencing tokens'
epochs live in ZooKeeper (`ZkEpoch`). Effects in PostgreSQL go through the
fenced SQL sink, `dedup.postgres.PostgresSink` (not imported here: it needs the `sql` extra,
psycopg 3). Every error is a `DedupError` (errors.py), grouped by the caller's next move:
`RetryLater`, `FixSetup`, `GiveUp`. See ../shared/design.md, "dedup".
"""

from dedup.bolt import Effects, IdempotencyBolt
from dedup.effects import ALLOWED_EFFECTS
from dedup.epoch import ZkEpoch
from dedup.errors import (
    DedupError,
    EffectNotAllowed,
    EpochConflict,
    EpochCorrupt,
    FixSetup,
    GiveUp,
    NotDurable,
    RetryLater,
    WaitAofUnsupported,
)
from dedup.records import (
    Effect,
    IdRecord,
    IdRecordState,
    Lease,
    LeaseRun,
    LeaseStatus,
    Settlement,
    SettleResult,
    SettleStatus,
)
from dedup.server_checks import server_durability_warnings
from dedup.store import EpochSource, IdempotencyStore

__all__ = [
    "ALLOWED_EFFECTS",
    "DedupError",
    "Effect",
    "EffectNotAllowed",
    "Effects",
    "EpochConflict",
    "EpochCorrupt",
    "EpochSource",
    "FixSetup",
    "GiveUp",
    "IdRecord",
    "IdRecordState",
    "IdempotencyBolt",
    "IdempotencyStore",
    "Lease",
    "LeaseRun",
    "LeaseStatus",
    "NotDurable",
    "RetryLater",
    "SettleResult",
    "SettleStatus",
    "Settlement",
    "WaitAofUnsupported",
    "ZkEpoch",
    "server_durability_warnings",
]
