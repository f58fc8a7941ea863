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
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaError, TopicPartition

from kspout.config import TopicConfig
from kspout.errors import KafkaRequestFailed
from kspout.kafka._client import consumer_settings
from kspout.lifecycle import Lifecycle

# librdkafka's wording (rdkafka_offset.c, `rd_kafka_offset_validate_tp`), stable since 2.1.
_TRUNCATED = re.compile(r"broker end offset is (-?\d+) \(offset leader epoch (-?\d+)\)")
# One consume call's wait: the verdict takes one round trip to the leader.
_SLICE = 0.1
# Seconds to wait for the verdict. The driver's loop waits meanwhile, so short; a leader that
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
    """Asks the leader whether a position in a leader epoch is still in its log.

    One consumer, assigned one partition per question and unassigned after; the driver asks
    only when something suggests a new leader wrote (a record of a newer epoch, or a stored
    anchor at a start), so a question costs one round trip now and then.
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

    def end_of_epoch(self, partition: int, position: int, epoch: int) -> tuple[int, int] | None:
        """`(end, end's epoch)` when the leader's log ends leader epoch `epoch` below
        `position` (the offsets from `end` on were truncated); None when `position` stands.

        Raises `KafkaRequestFailed` when the leader gave no verdict within `VERDICT_TIMEOUT`
        (the driver asks again when the partition's breaker lets it).
        """
        self.start()
        consumer = self._consumer
        assert consumer is not None
        topic = self._config.topic
        consumer.assign([TopicPartition(topic, partition, position, leader_epoch=epoch)])
        try:
            deadline = self._clock() + VERDICT_TIMEOUT
            while self._clock() < deadline:
                for msg in consumer.consume(1, _SLICE):
                    error = msg.error()
                    if error is None or error.code() == KafkaError._PARTITION_EOF:
                        return None  # librdkafka fetches only once the position is valid
                    if error.code() == KafkaError._AUTO_OFFSET_RESET:
                        return truncated_end(error.str())
                    if error.fatal():
                        break
        finally:
            consumer.unassign()
        raise KafkaRequestFailed(
            "leader epoch check",
            topic,
            partition,
            f"no answer for offset {position} in leader epoch {epoch}",
            "check that the partition has a live leader; kspout asks again",
        )
