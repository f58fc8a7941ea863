"""Where the partition's leader ends a leader epoch: the check behind truncation detection.

Kafka's consumer validates a position against the leader with OffsetForLeaderEpoch (KIP-320);
librdkafka does so when a partition is assigned with a leader epoch, and with
`auto.offset.reset=error` (kspout's setting) reports a truncated log as `_AUTO_OFFSET_RESET`
whose text names the broker's end offset ("Partition log truncation detected at offset P
(leader epoch E): broker end offset is N (offset leader epoch F)"). confluent-kafka has no call
for the request itself, so `EpochProbe` assigns one partition at the position, waits for
librdkafka's verdict and reads the end offset from that text.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping

from confluent_kafka import Consumer, KafkaError, TopicPartition

from kspout.config import TopicConfig
from kspout.kafka._client import consumer_settings
from kspout.lifecycle import Lifecycle

# librdkafka's wording (rdkafka_offset.c, `rd_kafka_offset_validate_tp`), stable since 2.1.
_TRUNCATED = re.compile(r"broker end offset is (-?\d+) \(offset leader epoch (-?\d+)\)")
# One consume call's wait: the verdict takes one round trip to the leader.
_SLICE = 0.1
# What a leader says of an anchor: `(end, end's epoch)` of a truncated log, None when it stands.
Verdict = tuple[int, int] | None
# Seconds to wait for the verdicts. The driver's loop waits meanwhile, so short; a leader that
# takes longer opens the partition's breaker, and the check runs again after its backoff.
VERDICT_TIMEOUT = 5.0


def truncated_end(text: str) -> tuple[int, int] | None:
    """`(end offset, its epoch)` from librdkafka's truncation error text; None for another
    error (an offset out of range, which the out-of-range policy handles).

    An end of -1 means the leader holds no epoch at or below ours (all of its log is newer):
    it reads as offset 0, so everything the leader has is processed (what lies below its low
    watermark then goes to the `out_of_range` policy).
    """
    if "truncation" not in text:
        return None
    found = _TRUNCATED.search(text)
    if found is None:
        return None
    return max(0, int(found.group(1))), int(found.group(2))


class EpochProbe(Lifecycle):
    """Asks partitions' leaders whether positions in leader epochs are still in their logs.

    One consumer, assigned the partitions of one question and unassigned after. The driver
    asks only when something suggests a new leader wrote (a record of a newer epoch, offsets
    above high) and once per stored anchor at a start, all the partitions it starts in one
    question: a round trip per leader, not per partition.
    """

    def __init__(self, config: TopicConfig, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._config = config
        self._clock = clock
        self._consumer: Consumer | None = None

    def start(self) -> None:
        if self._consumer is None:
            self._consumer = Consumer(consumer_settings(self._config))

    def close(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()

    def ends_of_epochs(self, anchors: Mapping[int, tuple[int, int]]) -> dict[int, Verdict]:
        """Per partition with an anchor `(position, epoch)`: `(end, end's epoch)` when its
        leader's log ends leader epoch `epoch` below `position` (the offsets from `end` on were
        truncated), None when `position` stands. Partitions whose leader gave no verdict within
        `VERDICT_TIMEOUT` are left out (the caller asks again later)."""
        self.start()
        consumer = self._consumer
        assert consumer is not None
        topic = self._config.topic
        consumer.assign(
            [
                TopicPartition(topic, p, pos, leader_epoch=epoch)
                for p, (pos, epoch) in anchors.items()
            ]
        )
        verdicts: dict[int, Verdict] = {}
        try:
            deadline = self._clock() + VERDICT_TIMEOUT
            while len(verdicts) < len(anchors) and self._clock() < deadline:
                for msg in consumer.consume(len(anchors), _SLICE):
                    p = msg.partition()
                    if p is None or p not in anchors or p in verdicts:
                        continue
                    error = msg.error()
                    if error is None or error.code() == KafkaError._PARTITION_EOF:
                        verdicts[p] = None  # librdkafka fetches only once the position is valid
                    elif error.code() == KafkaError._AUTO_OFFSET_RESET:
                        verdicts[p] = truncated_end(error.str())
                    # Else librdkafka retries (a leader moving); the deadline bounds it. A
                    # decided partition is not paused: against the real broker, a partition
                    # paused here gave no verdict to the next question (librdkafka keeps an
                    # application's pause flag on the partition across assignments).
        finally:
            consumer.unassign()
        return verdicts
