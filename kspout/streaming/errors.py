"""Errors of the streaming source, under kspout's root `KspoutError` and its groups."""

from __future__ import annotations

from kspout.errors import FixSetup, OffsetOutOfRange, PartitionStopped, resume_command


class CheckpointTopicMismatch(FixSetup):
    """The query's checkpoint holds offsets of another topic than its topic file names."""

    def __init__(self, stored: list[str], topic: str) -> None:
        self.stored = stored
        self.topic = topic
        found = ", ".join(map(repr, stored)) or "no topic"
        super().__init__(
            f"the query's checkpoint holds offsets of {found}, not {topic!r}: a checkpoint "
            "belongs to one topic; give this query a new checkpointLocation"
        )


class StreamStopped(PartitionStopped):
    """`out_of_range = "fail"` (`failOnDataLoss` true) stopped the query: a partition's next
    offset is no longer in Kafka. With a topic file, `command` moves it (`kspout offsets set`)
    and the query, started again from its checkpoint, resumes the partition there; without
    one (no ZooKeeper record to move), the hint says how to go on."""

    def __init__(
        self, topic: str, partition: int, offset: int, low: int, high: int, config_path: str | None
    ) -> None:
        self.config_path = config_path
        self.command = None if config_path is None else resume_command(config_path, partition)
        if self.command is None:
            hint = (
                'failOnDataLoss is true (out_of_range = "fail"): set it to false to go on at '
                "the earliest offset Kafka holds, or give the query a new checkpointLocation"
            )
        else:
            hint = (
                f'out_of_range = "fail" stopped the query here; run `{self.command}` (or --to '
                "latest, an offset, timestamp:<ms>), then start the query again from its "
                "checkpoint: it resumes the partition where the command moved it"
            )
        OffsetOutOfRange.__init__(self, topic, partition, offset, low, high, hint=hint)


class ReadStopped(OffsetOutOfRange):
    """`out_of_range = "fail"` (`failOnDataLoss` true) stopped a `spark.read`: offsets of its
    range are no longer in Kafka."""

    def __init__(self, topic: str, partition: int, offset: int, low: int, high: int) -> None:
        super().__init__(
            topic,
            partition,
            offset,
            low,
            high,
            hint=(
                f'out_of_range = "fail" (failOnDataLoss true) stops the read: start at {low} or '
                "later (startingOffsets), or set failOnDataLoss to false to read what Kafka holds"
            ),
        )
