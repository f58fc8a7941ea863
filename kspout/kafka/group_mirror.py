"""A copy of the commit points in a Kafka consumer group (`consumer_group` in the topic file),
so `kafka-consumer-groups --describe`, Burrow and other standard lag tools see the spout.

ZooKeeper stays the source of truth: after each commit round the driver hands over what the
Committer last wrote there, and nothing ever reads the group back. The mirror never joins the
group (no `subscribe`, no rebalance); it only commits offsets, as a consumer that `assign`s
its partitions would. The offset committed is the commit point, the next offset to process,
which is what Kafka's committed offset means, so the tools' lag equals `kspout_spout_lag`.

Commits are asynchronous. A commit waits for the group coordinator, and a synchronous one
would hold the single-threaded driver loop for as long as the coordinator is away (librdkafka
bounds the wait by `session.timeout.ms`, 45 s by default). States: *idle*, or *sending* one
commit request; `mirror()` sends, from idle, the partitions whose offset Kafka has not
confirmed; librdkafka's answer (served by `poll`, on the driver's thread) confirms offsets and
returns to idle. What an answer did not confirm (an error, no coordinator) goes again with the
next round. Failures are logged, never raised.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from kspout.config import TopicConfig
from kspout.kafka._client import client_settings
from kspout.lifecycle import Lifecycle

log = logging.getLogger(__name__)

# Milliseconds a commit waits for the group coordinator (librdkafka's `session.timeout.ms`;
# the group is never joined, so that is all the setting does here). Also bounds close().
COMMIT_TIMEOUT_MS = 6000
# Seconds close() waits for the last commits to be confirmed.
CLOSE_WAIT = COMMIT_TIMEOUT_MS / 1000 + 1.0
POLL_STEP = 0.05  # seconds per poll while close() waits


class GroupMirror(Lifecycle):
    """Commits each partition's commit point to `config.consumer_group` (inert without one).

    `confirmed` holds the offsets Kafka acknowledged, by partition.
    """

    def __init__(self, config: TopicConfig) -> None:
        self._config = config
        self.group = config.consumer_group
        self._consumer: Consumer | None = None
        self._wanted: dict[int, int] = {}
        self.confirmed: dict[int, int] = {}
        self._sending = False
        self._error: str | None = None  # the last failure, until a commit succeeds

    def start(self) -> None:
        if self.group is None or self._consumer is not None:
            return
        self._consumer = Consumer(
            client_settings(
                self._config,
                **{
                    "group.id": self.group,
                    "client.id": f"kspout-{self._config.spout_id}-group-mirror",
                    "enable.auto.commit": False,
                    "enable.auto.offset.store": False,
                    "session.timeout.ms": COMMIT_TIMEOUT_MS,
                    "on_commit": self._answered,
                },
            )
        )
        log.info("mirroring the commit points of %s to group %s", self._config.topic, self.group)

    def mirror(self, committed: Mapping[int, int | None]) -> None:
        """Commit the offsets ZooKeeper holds (partition -> offset, None: no record yet) to
        the group. Partitions missing from `committed` left this instance: forgotten."""
        consumer = self._consumer
        if consumer is None:
            return
        consumer.poll(0)  # the answer to the last commit, if it came
        self._wanted = {p: offset for p, offset in committed.items() if offset is not None}
        self.confirmed = {p: o for p, o in self.confirmed.items() if p in self._wanted}
        self._send(consumer)

    def _send(self, consumer: Consumer) -> None:
        """From idle: commit every wanted offset Kafka has not confirmed."""
        topic = self._config.topic
        changed = [
            TopicPartition(topic, p, offset)
            for p, offset in sorted(self._wanted.items())
            if self.confirmed.get(p) != offset
        ]
        if self._sending or not changed:
            return
        try:
            consumer.commit(offsets=changed, asynchronous=True)
        except KafkaException as exc:
            self._failed(str(exc.args[0]))
            return
        self._sending = True

    def _answered(self, error: KafkaError | None, partitions: list[TopicPartition]) -> None:
        """librdkafka's answer to the commit sent (called from `poll`, on this thread)."""
        self._sending = False
        failures = []
        for tp in partitions:
            if error is None and tp.error is None:
                self.confirmed[tp.partition] = tp.offset
            else:
                failures.append(f"[{tp.partition}] {tp.error or error}")
        if failures:
            self._failed("; ".join(failures))
        elif self._error is not None:
            self._error = None
            log.info("commits to consumer group %s succeed again", self.group)

    def _failed(self, error: str) -> None:
        """Log a failure once (until it changes or commits succeed); the next round retries."""
        if error != self._error:
            log.warning(
                "could not commit %s's commit points to consumer group %s (%s); trying again "
                "with the next commit (ZooKeeper holds them: this only delays lag tools)",
                self._config.topic,
                self.group,
                error,
            )
        self._error = error

    def close(self) -> None:
        """Send what Kafka has not confirmed, wait for it (`CLOSE_WAIT` at most), close."""
        consumer, self._consumer = self._consumer, None
        if consumer is None:
            return
        deadline = time.monotonic() + CLOSE_WAIT
        self._await_commit(consumer, deadline)  # the commit in flight
        if self._error is None:  # the coordinator answers: send the last offsets
            self._send(consumer)
            self._await_commit(consumer, deadline)
        if self._sending:
            log.warning(
                "consumer group %s did not confirm the last commit points before close",
                self.group,
            )
        consumer.close()

    def _await_commit(self, consumer: Consumer, deadline: float) -> None:
        """Poll until the commit in flight is answered or `deadline` passes."""
        while self._sending and time.monotonic() < deadline:
            consumer.poll(POLL_STEP)
