"""Errors of the streaming source, under kspout's root `KspoutError`."""

from __future__ import annotations

from kspout.errors import KspoutError, OffsetOutOfRange, PartitionStopped, resume_command


class CheckpointTopicMismatch(KspoutError):
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
    """`out_of_range = "fail"` stopped the query: a partition's next offset is no longer in
    Kafka. `command` moves it (`kspout offsets set`); the query, started again from its
    checkpoint, resumes the partition there."""

    def __init__(
        self, topic: str, partition: int, offset: int, low: int, high: int, config_path: str
    ) -> None:
        self.config_path = config_path
        self.command = resume_command(config_path, partition)
        OffsetOutOfRange.__init__(
            self,
            topic,
            partition,
            offset,
            low,
            high,
            hint=(
                f'out_of_range = "fail" stopped the query here; run `{self.command}` (or --to '
                "latest, an offset, timestamp:<ms>), then start the query again from its "
                "checkpoint: it resumes the partition where the command moved it"
            ),
        )
