"""The partition manager: storm-kafka's per-partition bookkeeping, rewritten without its defects
(the state machine is written in `manager`)."""

from kspout.partition_manager.dead_letters import DeadLetterTicket
from kspout.partition_manager.manager import PartitionManager
from kspout.partition_manager.out_of_range import OutOfRangeReset
from kspout.partition_manager.plans import Plan, Span
from kspout.partition_manager.states import (
    DONE,
    UNPLANNED,
    DeadLetterPending,
    InFlight,
    State,
    Waiting,
)
from kspout.partition_manager.stats import Stats
from kspout.partition_manager.truncation import Truncation

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
    "Truncation",
    "Waiting",
]
