"""Dead letters between the partitions and the background writer (`dead_letters.py`).

Each loop turn confirms on its partition what the writer finished (`dead_lettered`: the
offsets are finished; `dead_letter_failed`: they are handed out again later), then hands the
writer what the partitions gave up since, with the tracebacks logged for them. The dead-letter
topic has a breaker of its own: while its writes keep failing nothing new is handed over (a
down topic is not hammered), and a half-open one lets one partition's letters through as its
probe. A write Kafka refused this principal (a revoked Write ACL) is kept in `refused` for the
driver, which stops the run with it; nothing more is handed over.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from kspout.config import TopicConfig
from kspout.driver.breaker import BreakerState, CircuitBreaker
from kspout.driver.dead_letters import DeadLetterWorker
from kspout.driver.failure_log import FailureLog
from kspout.driver.owned import OwnedPartition
from kspout.errors import KafkaRefused
from kspout.wording import count

log = logging.getLogger(__name__)


class DeadLetterHandoff:
    """Confirms what the writer finished and hands it what the partitions gave up."""

    def __init__(
        self,
        config: TopicConfig,
        writer: DeadLetterWorker,
        failures: FailureLog,
        partitions: Mapping[int, OwnedPartition],
    ) -> None:
        self._config = config
        self._writer = writer
        self._failures = failures
        self._partitions = partitions
        self._breaker = CircuitBreaker.waiting_as(
            f"{config.dlq_topic} writes", config.infra_backoff
        )
        self.refused: KafkaRefused | None = None  # the first write Kafka refused the principal

    def exchange(self) -> None:
        """Confirm what the writer finished; hand it what the partitions gave up since."""
        breaker = self._breaker
        for outcome in self._writer.completed():
            part = self._partitions.get(outcome.partition)
            if part is None:
                continue  # it moved: its next owner runs those offsets again
            if outcome.error is None:
                part.manager.dead_lettered(outcome.offsets)
                self._failures.dead_lettered(outcome.partition, outcome.offsets)
                breaker.success()
                log.warning(
                    "%s[%d] dead-lettered %s to %s",
                    self._config.topic,
                    outcome.partition,
                    count(len(outcome.offsets), "offset"),
                    self._config.dlq_topic,
                )
            else:
                part.manager.dead_letter_failed(outcome.offsets)  # handed out again later
                breaker.failure(outcome.error)
                self.refused = self.refused or outcome.refused
        if breaker.state is BreakerState.OPEN or self.refused is not None:
            return  # the dead-letter topic keeps failing: wait, do not hammer it
        for p, part in self._partitions.items():
            pm = part.manager
            tickets = pm.take_dead_letters()
            if not tickets:
                continue
            if breaker.state is BreakerState.HALF_OPEN and not breaker.allow():
                pm.dead_letter_failed([t.offset for t in tickets])  # after the probe's answer
                return
            offsets = [t.offset for t in tickets]
            self._writer.submit(p, tickets, self._failures.tracebacks(p, offsets))
