"""Whose fault a failed Spark job is, by what Spark says about it, and what that costs.

Tasks never raise for failures outside per-message code (they report them), so a job that
fails has lost a task without a word: its Python worker died (a record killed it, or the
machine did), or Spark could not run it at all. The first is a *crash*, ambiguous until the
driver isolates the records the task left open; anything else is the infrastructure's fault
and costs the messages nothing (`FailureCosts`).
"""

from __future__ import annotations

import enum
import logging
import re
from collections.abc import Mapping

from kspout.driver.batches import Ended, RunningBatch
from kspout.driver.isolation import Isolation
from kspout.driver.owned import OwnedPartition
from kspout.outcomes import FailReason
from kspout.partition_manager import Span

log = logging.getLogger(__name__)

# What Spark (3.5 / 4.x) reports when a task's Python worker or its executor died under it.
_CRASH = re.compile(
    r"Python worker exited unexpectedly|worker .*crashed|ExecutorLostFailure|"
    r"Connection reset|Broken pipe|EOFException|killed by signal|SIGKILL|OutOfMemory",
    re.IGNORECASE,
)


class JobFailure(enum.Enum):
    """What a failed job means for the offsets its tasks left unsettled."""

    CRASH = "crash"  # a worker died: isolate the open offsets to find the record that did it
    INFRASTRUCTURE = "infrastructure"  # anything else: release them, back off the partition


def classify(error: str) -> JobFailure:
    """Classify a failed job by its error text (the Spark exception, one or more lines)."""
    return JobFailure.CRASH if _CRASH.search(error) else JobFailure.INFRASTRUCTURE


class FailureCosts:
    """What a batch that ended in error costs the partitions its tasks left open.

    A batch cancelled because a record in it hung releases the open offsets (no attempt
    spent) and opens the breakers of partitions whose task hung outside any record; an
    infrastructure failure releases them and opens their breakers; a crash makes them suspects
    (`Isolation`), or, for a group run alone, fails the record that killed the worker with
    CRASH. A partition that left this instance is skipped: its next owner runs what was open.
    """

    def __init__(
        self, topic: str, partitions: Mapping[int, OwnedPartition], isolation: Isolation
    ) -> None:
        self._topic = topic
        self._partitions = partitions
        self._isolation = isolation
        self.errors = 0  # jobs that failed (a worker died, or Spark could not run them)

    def charge(self, ended: Ended, error: str) -> None:
        """`ended`'s job failed with `error` (Spark's text): charge its open partitions."""
        batch = ended.batch
        open_partitions = [p for p in batch.tasks if p not in batch.finished]
        if batch.cancelled:
            for p in open_partitions:
                self._release(batch, p, "its batch was cancelled: another record in it hung")
            for p in ended.hung_partitions & self._partitions.keys():
                self._partitions[p].breaker.failure(
                    "a task hung outside any record (a dependency?)"
                )
            return
        self.errors += 1
        first = error.strip().splitlines()[0][:300]
        if classify(error) is JobFailure.CRASH:
            log.warning(
                "batch %d: a worker died (%s); isolating what it left open", batch.id, first
            )
            for p in open_partitions:
                self.crashed(batch, p, first)
        else:
            log.error("batch %d failed outside any message (%s); retrying it", batch.id, first)
            for p in open_partitions:
                self._release(batch, p, first)
                if p in self._partitions:
                    self._partitions[p].breaker.failure(first)

    def crashed(self, batch: RunningBatch, p: int, error: str) -> None:
        """A task of `batch` died: its open offsets become suspects, or, for a record that
        died alone, the culprit fails with CRASH."""
        if p not in self._partitions:
            return  # it moved: its next owner runs what was open
        open_spans = self._open(batch, p)
        generation = batch.tasks[p].plan.generation
        group = batch.group
        if group is None or group.partition != p:
            self._isolation.suspect(p, generation, open_spans)
            return
        culprit = self._isolation.died(group, open_spans, batch.last_seen(p))
        if culprit is not None:
            attempt = batch.tasks[p].plan.attempt_of(culprit)
            reason = f"killed its Python worker when run alone ({error})"
            log.warning("%s[%d] offset %d %s", self._topic, p, culprit, reason)
            pm = self._partitions[p].manager
            pm.fail(culprit, FailReason.CRASH, reason, attempt, generation=generation)

    def _open(self, batch: RunningBatch, p: int) -> list[Span]:
        """What `batch` left unsettled in partition `p`, at the attempts it ran them."""
        part, generation = self._partitions.get(p), batch.tasks[p].plan.generation
        if part is None or part.manager.generation != generation:
            return []
        pm = part.manager
        return [
            Span(lo, hi, span.attempt)
            for span in batch.open_spans(p)
            for lo, hi in pm.unsettled(span.start, span.end, span.attempt)
        ]

    def _release(self, batch: RunningBatch, p: int, error: str) -> None:
        for span in self._open(batch, p):
            self._partitions[p].manager.release(span.start, span.end, span.attempt, error)
