"""Every error kspout raises, under one root, each carrying what the caller needs next.

Classes are grouped by the caller's next move:

* configuration and usage errors (`ConfigError`) — fix the input and start again;
* data errors the spout handles itself (`OffsetOutOfRange` is turned into a reset or a stop by
  the partition's `out_of_range` policy);
* ownership errors (`OffsetConflict`, `TopicMismatch`) — never retried: another writer or
  another topic owns the stored record, so writing would corrupt it;
* infrastructure errors (`ZooKeeperUnavailable`, `KafkaUnavailable`, `StackError`) — raised
  after transient failures were already retried.
"""

from __future__ import annotations


class KspoutError(Exception):
    """Root of every error raised by kspout."""


class ConfigError(KspoutError):
    """A topic config file is missing, malformed, or holds a value that is not allowed."""

    def __init__(self, path: str, key: str | None, message: str) -> None:
        self.path = path
        self.key = key
        self.message = message
        where = f"{path}: {key}" if key else path
        super().__init__(f"{where}: {message}")


class OffsetOutOfRange(KspoutError):
    """The offset a partition needs is outside Kafka's `[low, high)` for that partition."""

    def __init__(
        self, topic: str, partition: int, offset: int, low: int, high: int, hint: str = ""
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.low = low
        self.high = high
        msg = (
            f"{topic}[{partition}]: offset {offset} is out of range; Kafka holds [{low}, {high})"
        )
        super().__init__(f"{msg}. {hint}" if hint else msg)


class PartitionStopped(OffsetOutOfRange):
    """The `out_of_range = "fail"` policy stopped a partition until an operator moves it."""

    def __init__(self, topic: str, partition: int, offset: int, low: int, high: int) -> None:
        super().__init__(
            topic,
            partition,
            offset,
            low,
            high,
            hint=(
                "out_of_range = \"fail\" stops the partition here; move it with "
                f"`kspout offsets set --config <file> --partition {partition} --to earliest` "
                "(or latest, a number, timestamp:<ms>) and start again"
            ),
        )


class OffsetStoreError(KspoutError):
    """A problem with the offsets kept in ZooKeeper."""


class OffsetConflict(OffsetStoreError):
    """A compare-and-set commit lost: someone else wrote the record since we read it."""

    def __init__(self, path: str, expected_version: int) -> None:
        self.path = path
        self.expected_version = expected_version
        super().__init__(
            f"{path} changed since version {expected_version}: another spout instance or an "
            "operator moved it; this instance no longer owns the partition and stops committing"
        )


class TopicMismatch(OffsetStoreError):
    """The stored offset record belongs to another topic (two spouts share one spout id)."""

    def __init__(self, path: str, stored_topic: str, topic: str) -> None:
        self.path = path
        self.stored_topic = stored_topic
        self.topic = topic
        super().__init__(
            f"{path} holds offsets for topic {stored_topic!r}, not {topic!r}: two spouts share "
            "this spout_id; give each topic its own spout_id (or zk_root)"
        )


class ZooKeeperUnavailable(OffsetStoreError):
    """ZooKeeper did not answer after the configured retries."""


class KafkaUnavailable(KspoutError):
    """Kafka did not answer (metadata, watermarks, fetch) after the configured retries."""


class StackError(KspoutError):
    """The embedded development stack could not start, or a part of it is missing."""
