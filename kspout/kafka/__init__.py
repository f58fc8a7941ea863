"""Kafka I/O with confluent-kafka: metadata, fetching planned offsets, dead letters.

One module per job: `metadata` (partitions, watermarks, timestamps, start positions),
`fetcher` (exactly the planned offsets of a partition), `deadletter` (the dead-letter topic),
`records` (the plain values they hand out), `epochs` (where a leader ends a leader epoch: a
truncated log), `access` (a refused login or ACL: an error to fix, not an outage) and
`rights` (what a spout's principal may do, asked at start). Every client is made with
`client_settings`, which routes librdkafka's log through Python logging (`LIBRDKAFKA_LOG`).
"""

from kspout.kafka._client import LIBRDKAFKA_LOG, client_settings
from kspout.kafka.deadletter import DeadLetterWriter
from kspout.kafka.epochs import EpochProbe
from kspout.kafka.fetcher import PartitionFetcher
from kspout.kafka.metadata import KafkaMetadata
from kspout.kafka.records import DeadLetter, FetchResult, Record

__all__ = [
    "LIBRDKAFKA_LOG",
    "DeadLetter",
    "DeadLetterWriter",
    "EpochProbe",
    "FetchResult",
    "KafkaMetadata",
    "PartitionFetcher",
    "Record",
    "client_settings",
]
