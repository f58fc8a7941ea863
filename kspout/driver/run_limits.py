"""When `Driver.run` ends besides its `stop` event: a batch budget, a failure budget, or a
refusal from Kafka that no retry cures."""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass

from kspout.errors import KafkaRefused
from kspout.wording import count

log = logging.getLogger(__name__)


class Ending(enum.Enum):
    """How a run ends: `DONE` lets running batches finish; `SOON` also tells the executor to
    stop soon (an in-process batch releases the records it has not started)."""

    DONE = "done"
    SOON = "soon"


@dataclass(frozen=True, slots=True)
class RunLimits:
    """`max_batches` submitted, or more than `max_failures` records failed for their own fault
    (user code raised); None: no such limit."""

    max_batches: int | None = None
    max_failures: int | None = None

    def ending(
        self, topic: str, submitted: int, failed_records: int, refused: KafkaRefused | None
    ) -> Ending | None:
        """Whether the run ends now, and how (None: it goes on); logs why when it stops early."""
        if refused is not None:
            log.warning("%s: stopping: %s", topic, refused)
            return Ending.SOON
        if self.max_batches is not None and submitted >= self.max_batches:
            return Ending.DONE
        if self.max_failures is not None and failed_records > self.max_failures:
            log.error(
                "%s: %s failed, more than max_failures=%d allows: stopping",
                topic,
                count(failed_records, "record"),
                self.max_failures,
            )
            return Ending.SOON
        return None
