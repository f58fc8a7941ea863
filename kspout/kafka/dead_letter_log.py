"""Read a topic's dead letters back from its dead-letter topic, and replay chosen ones.

`DeadLetterLog.find` reads the dead-letter topic (`dlq_topic`) from low to high of each of its
partitions with kspout's fetcher (an assigned consumer that never commits) and keeps the
letters of this config's topic that a `LetterFilter` chooses. A record without kspout's
dead-letter headers, or from another source topic (a dead-letter topic shared by several
topics), is counted as foreign and skipped.

`LetterReplayer.replay` produces chosen letters again with an idempotent producer: the same
key and value, the original headers (kspout's dead-letter headers removed) and a mark naming
the letter, `kspout.replayed_from` = `<dlq topic>/<partition>/<offset>`, and when,
`kspout.replayed_at` (ms). So the message id the dedup bolt reads (`[dedup] id_source`: the key,
a header or a JSON field) is unchanged, and a replayed letter applies at most once however
often it is replayed.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from kspout.config import TopicConfig
from kspout.errors import KafkaRequestFailed, KafkaUnavailable, LetterNotFound
from kspout.kafka.deadletter import (
    ATTEMPTS,
    ERROR,
    FLUSH_MARGIN,
    HEADER_PREFIX,
    LETTER_HEADERS,
    REASON,
    SOURCE_OFFSET,
    SOURCE_PARTITION,
    SOURCE_TOPIC,
    TRACEBACK,
    IdempotentProducer,
)
from kspout.kafka.fetcher import PartitionFetcher
from kspout.kafka.metadata import KafkaMetadata
from kspout.kafka.records import Headers, Record
from kspout.lifecycle import Lifecycle
from kspout.ranges import Range, runs
from kspout.wording import count

_OURS = frozenset((*LETTER_HEADERS, TRACEBACK))  # headers a letter does not replay
REPLAYED_FROM = HEADER_PREFIX + "replayed_from"  # `<dlq topic>/<partition>/<offset>`
REPLAYED_AT = HEADER_PREFIX + "replayed_at"  # ms since the epoch
REPLAY_MARKS = (REPLAYED_FROM, REPLAYED_AT)
# Offsets per fetch while reading a dead-letter partition: large enough that a fetch's round
# trip vanishes, small enough to show progress and to stop soon after `limit` letters.
READ_STEP = 10_000
# librdkafka's RD_KAFKA_PARTITION_UA: the producer's partitioner chooses (by key).
ANY_PARTITION = -1


class ReplayFailed(KafkaUnavailable):
    """Kafka did not acknowledge some replayed letters; `results` has every letter's outcome."""

    def __init__(self, results: Sequence[Replay]) -> None:
        self.results = list(results)
        failed = [r for r in self.results if r.error is not None]
        first = failed[0]
        offsets = " ".join(
            f"--offset {r.letter.dlq_partition}:{r.letter.dlq_offset}" for r in failed
        )
        super().__init__(
            f"{len(failed)} of {count(len(self.results), 'dead letter')} not replayed to "
            f"{first.topic} (first: {first.letter.address}: {first.error}); check that the topic "
            f"exists and this client may write to it, then replay those alone: {offsets}. A "
            "letter reported failed may still have been written (a timeout is in doubt): under "
            "the dedup bolt replaying it again is safe"
        )


@dataclass(frozen=True, slots=True)
class StoredLetter:
    """A dead letter as read back: where it lies, where it came from, and the original."""

    dlq_topic: str
    dlq_partition: int
    dlq_offset: int
    timestamp: int  # ms since the epoch: when it was dead-lettered
    source_topic: str
    source_partition: int
    source_offset: int
    attempts: int
    reason: str  # `<kind> (<cause>)`, e.g. `exception (retries exhausted)`
    error: str  # the last error; "" when there was none
    key: bytes | None
    value: bytes | None
    headers: Headers  # the original headers, kspout's dead-letter headers removed
    traceback: str = ""  # where user code raised; "" when it did not

    @property
    def address(self) -> str:
        """`<dlq topic>/<partition>/<offset>`: names the letter in a replay mark."""
        return f"{self.dlq_topic}/{self.dlq_partition}/{self.dlq_offset}"

    @classmethod
    def parse(cls, record: Record) -> StoredLetter | None:
        """The letter a dead-letter record holds; None when it lacks kspout's headers."""
        ours = {name: value for name, value in record.headers if name in _OURS}
        if len(ours.keys() & LETTER_HEADERS) < len(LETTER_HEADERS):
            return None
        text = {name: (value or b"").decode("utf-8", "replace") for name, value in ours.items()}
        try:
            partition, offset = int(text[SOURCE_PARTITION]), int(text[SOURCE_OFFSET])
            attempts = int(text[ATTEMPTS])
        except ValueError:
            return None
        return cls(
            dlq_topic=record.topic,
            dlq_partition=record.partition,
            dlq_offset=record.offset,
            timestamp=record.timestamp,
            source_topic=text[SOURCE_TOPIC],
            source_partition=partition,
            source_offset=offset,
            attempts=attempts,
            reason=text[REASON],
            error=text[ERROR],
            key=record.key,
            value=record.value,
            headers=tuple(h for h in record.headers if h[0] not in _OURS),
            traceback=text.get(TRACEBACK, ""),
        )


@dataclass(frozen=True, slots=True)
class LetterFilter:
    """Which letters an operator chose; every given criterion must hold (none: all letters)."""

    partitions: frozenset[int] = frozenset()  # source partitions
    reason: str | None = None  # a substring of the reason, any case: `timeout`, `behind`
    since_ms: int | None = None  # dead-lettered at or after
    until_ms: int | None = None  # dead-lettered before
    offsets: frozenset[tuple[int, int]] = frozenset()  # exact letters: (dlq partition, offset)

    @property
    def narrows(self) -> bool:
        """True when some criterion is given, so not every letter is chosen."""
        return bool(
            self.partitions
            or self.reason
            or self.since_ms is not None
            or self.until_ms is not None
            or self.offsets
        )

    def matches(self, letter: StoredLetter) -> bool:
        """True when the letter meets every criterion."""
        return (
            (not self.partitions or letter.source_partition in self.partitions)
            and (not self.reason or self.reason.casefold() in letter.reason.casefold())
            and (self.since_ms is None or letter.timestamp >= self.since_ms)
            and (self.until_ms is None or letter.timestamp < self.until_ms)
            and (not self.offsets or (letter.dlq_partition, letter.dlq_offset) in self.offsets)
        )


@dataclass(frozen=True, slots=True)
class LetterScan:
    """What `DeadLetterLog.find` read and chose."""

    dlq_topic: str
    exists: bool  # False: the dead-letter topic has no partitions (nothing was dead-lettered)
    read: int  # offsets read
    foreign: int  # records read that are not dead letters of this topic
    letters: list[StoredLetter]  # the chosen ones, oldest first


class _Tally:
    """Offsets read and foreign records so far, reported to a progress callback as they grow."""

    def __init__(self, total: int, on_progress: Callable[[int, int], None] | None) -> None:
        self.total = total
        self.read = 0
        self.foreign = 0
        self._on_progress = on_progress

    def advance(self, offsets: int) -> None:
        self.read += offsets
        if self._on_progress is not None:
            self._on_progress(min(self.read, self.total), self.total)


def _take(spans: list[Range], count: int) -> tuple[list[Range], list[Range]]:
    """The first `count` offsets of `spans`, and the rest."""
    taken: list[Range] = []
    rest = list(spans)
    while rest and count > 0:
        start, end = rest.pop(0)
        stop = min(end, start + count)
        taken.append((start, stop))
        count -= stop - start
        if stop < end:
            rest.insert(0, (stop, end))
    return taken, rest


def _clip(spans: list[Range], low: int, high: int) -> list[Range]:
    """The parts of `spans` inside `[low, high)`."""
    clipped = [(max(start, low), min(end, high)) for start, end in spans]
    return [(start, end) for start, end in clipped if start < end]


class DeadLetterLog(Lifecycle):
    """Reads the dead letters of the config's topic from its dead-letter topic."""

    def __init__(self, config: TopicConfig) -> None:
        self._config = config
        self._topic = config.dlq_topic
        self._metadata = KafkaMetadata(config)
        self._fetcher = PartitionFetcher(config)

    def start(self) -> None:
        self._metadata.start()
        self._fetcher.start()

    def close(self) -> None:
        self._fetcher.close()
        self._metadata.close()

    def find(
        self,
        chosen: LetterFilter,
        *,
        limit: int | None = None,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> LetterScan:
        """The letters `chosen` picks, oldest first, at most `limit` (the oldest ones).

        Calls `on_progress(read, total)` as it reads. Raises LetterNotFound when a letter
        named in `chosen.offsets` is not a dead letter of this topic, and TopicNotFound when
        the topic itself does not exist (a misspelled one has no dead-letter topic either).
        """
        self._metadata.require_topic(self._config.topic)
        partitions = self._metadata.partitions(self._topic)
        plan = self._plan(partitions, chosen)
        tally = _Tally(sum(end - start for s in plan.values() for start, end in s), on_progress)
        letters: list[StoredLetter] = []
        named: set[tuple[int, int]] = set()
        for partition, spans in plan.items():
            matches, seen = self._choose(partition, spans, chosen, limit, tally)
            letters += matches
            named.update((partition, offset) for offset in seen)
        missing = sorted(chosen.offsets - named)
        if missing:
            why = f"not a dead letter of {self._config.topic}, or no longer in Kafka"
            raise LetterNotFound(self._topic, *missing[0], why)
        letters.sort(key=lambda letter: (letter.timestamp, letter.dlq_partition, letter.dlq_offset))
        return LetterScan(self._topic, bool(partitions), tally.read, tally.foreign, letters[:limit])

    def _plan(self, partitions: list[int], chosen: LetterFilter) -> dict[int, list[Range]]:
        """The spans to read per dead-letter partition; every named letter must be in one."""
        plan = {partition: self._spans(partition, chosen) for partition in partitions}
        for partition, offset in sorted(chosen.offsets):
            if partition not in plan:
                why = "no such partition" if partitions else "the topic does not exist"
                raise LetterNotFound(self._topic, partition, offset, why)
        return plan

    def _choose(
        self,
        partition: int,
        spans: list[Range],
        chosen: LetterFilter,
        limit: int | None,
        tally: _Tally,
    ) -> tuple[list[StoredLetter], set[int]]:
        """The letters `chosen` picks in one partition, and the offsets of the named letters
        found there (whether or not they match the other criteria)."""
        matches: list[StoredLetter] = []
        seen: set[int] = set()
        for letter in self._letters(partition, spans, tally):
            if chosen.offsets:
                seen.add(letter.dlq_offset)
            if chosen.matches(letter):
                matches.append(letter)
                # Letters come oldest first; with named letters, every one must be checked.
                if len(matches) == limit and not chosen.offsets:
                    break
        return matches, seen

    def _spans(self, partition: int, chosen: LetterFilter) -> list[Range]:
        """The offsets of a dead-letter partition to read: the named ones, or all from the
        first at or after `since` (Kafka's time index) to high."""
        low, high = self._metadata.watermarks(self._topic, partition)
        if chosen.offsets:
            named = sorted(o for p, o in chosen.offsets if p == partition)
            for offset in named:
                if not low <= offset < high:
                    why = f"the partition holds offsets {low} to {high - 1}"
                    raise LetterNotFound(self._topic, partition, offset, why)
            return list(runs(named))
        start = low
        if chosen.since_ms is not None:
            found = self._metadata.offset_for_timestamp(self._topic, partition, chosen.since_ms)
            start = high if found is None else max(low, found)
        return [(start, high)] if start < high else []

    def _letters(self, partition: int, spans: list[Range], tally: _Tally) -> Iterator[StoredLetter]:
        """The letters of this topic in `spans`, in offset order, read `READ_STEP` at a time.

        When retention deletes offsets meanwhile, the read goes on from the new low.
        """
        rest = spans
        while rest:
            batch, rest = _take(rest, READ_STEP)
            result = self._fetcher.fetch(self._topic, partition, batch)
            tally.advance(sum(end - start for start, end in batch))
            for record in result.records:
                letter = StoredLetter.parse(record)
                if letter is None or letter.source_topic != self._config.topic:
                    tally.foreign += 1
                    continue
                yield letter
            if result.out_of_range is not None:
                low, high = result.out_of_range
                reached = result.reached(batch[0][0])
                if reached <= batch[0][0] and low <= reached < high:
                    raise KafkaRequestFailed(
                        "read",
                        self._topic,
                        partition,
                        f"offset {reached} reported out of range inside [{low}, {high})",
                        "try again",
                    )
                rest = _clip(batch + rest, max(low, reached), high)


def _describe(error: KafkaError) -> str:
    """`NAME: text`, e.g. `_UNKNOWN_PARTITION: Local: Unknown partition`."""
    return f"{error.name()}: {error.str()}"


def replay_headers(
    letter: StoredLetter, replayed_at_ms: int
) -> list[tuple[str, str | bytes | None]]:
    """The original headers (an earlier replay's marks replaced), then this replay's marks."""
    kept: list[tuple[str, str | bytes | None]] = [
        (name, value) for name, value in letter.headers if name not in REPLAY_MARKS
    ]
    marks = [(REPLAYED_FROM, letter.address), (REPLAYED_AT, str(replayed_at_ms))]
    return kept + [(name, value.encode()) for name, value in marks]


def replay_target(letter: StoredLetter, to_topic: str | None) -> tuple[str, int | None]:
    """Where a letter goes: its source partition when it goes back to its source topic;
    another topic's partition is left to the producer's partitioner (None)."""
    topic = to_topic or letter.source_topic
    return topic, letter.source_partition if topic == letter.source_topic else None


@dataclass(frozen=True, slots=True)
class Replay:
    """One letter's replay: where it was written, or why not (`error`)."""

    letter: StoredLetter
    topic: str
    partition: int | None  # None when the partitioner chooses (a dry run) or it failed
    offset: int | None  # None unless written
    error: str | None = None


class LetterReplayer(IdempotentProducer):
    """Produces dead letters back (idempotent, acks=all: a retried send is never doubled)
    and waits for every delivery report."""

    def __init__(self, config: TopicConfig, *, clock: Callable[[], float] = time.time) -> None:
        super().__init__(config, "replay")
        self._clock = clock

    def replay(self, letters: Sequence[StoredLetter], to_topic: str | None = None) -> list[Replay]:
        """Produce each letter to `to_topic` (default: its source topic) and wait for Kafka.

        Returns where each was written. Raises ReplayFailed, with every letter's outcome, when
        Kafka did not acknowledge some.
        """
        if self._producer is None:
            raise RuntimeError("LetterReplayer.start() was not called")
        producer = self._producer
        now_ms = int(self._clock() * 1000)
        targets = [replay_target(letter, to_topic) for letter in letters]
        results = [
            Replay(letter, topic, None, None, "no delivery report before the timeout")
            for letter, (topic, _) in zip(letters, targets, strict=True)
        ]

        def report(index: int, error: KafkaError | None, msg: Message) -> None:
            old = results[index]
            if error is None:
                results[index] = Replay(old.letter, old.topic, msg.partition(), msg.offset())
            else:
                results[index] = Replay(old.letter, old.topic, None, None, _describe(error))

        for index, (letter, (topic, partition)) in enumerate(zip(letters, targets, strict=True)):
            on_delivery = functools.partial(report, index)
            try:
                self._produce(producer, topic, partition, letter, now_ms, on_delivery)
            except KafkaException as exc:  # refused before sending (too large, bad topic)
                results[index] = Replay(letter, topic, None, None, _describe(exc.args[0]))
        producer.flush(self._config.fetch_timeout + FLUSH_MARGIN)
        if any(result.error is not None for result in results):
            raise ReplayFailed(results)
        return results

    @staticmethod
    def _produce(
        producer: Producer,
        topic: str,
        partition: int | None,
        letter: StoredLetter,
        now_ms: int,
        on_delivery: Callable[[KafkaError | None, Message], None],
    ) -> None:
        """Queue one letter, serving delivery reports while the local queue is full."""
        while True:
            try:
                producer.produce(
                    topic,
                    key=letter.key,
                    value=letter.value,
                    headers=replay_headers(letter, now_ms),
                    partition=ANY_PARTITION if partition is None else partition,
                    on_delivery=on_delivery,
                )
                return
            except BufferError:
                producer.poll(0.1)
