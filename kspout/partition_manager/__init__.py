"""The partition manager: storm-kafka's per-partition bookkeeping, rewritten without its defects
(the rules and their states are described in `manager`)."""

from kspout.partition_manager.manager import (
    DONE,
    UNPLANNED,
    DeadLetterPending,
    DeadLetterTicket,
    InFlight,
    OutOfRangeReset,
    PartitionManager,
    Plan,
    Span,
    State,
    Stats,
    Waiting,
)

__all__ = [
    "DONE",
    "UNPLANNED",
    "DeadLetterPending",
    "DeadLetterTicket",
    "InFlight",
    "OutOfRangeReset",
    "PartitionManager",
    "Plan",
    "Span",
    "State",
    "Stats",
    "Waiting",
]
