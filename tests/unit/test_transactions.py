"""`TransactionWatch`: which partitions it asks about, and when; a probe stands in for Kafka
(the real one is tried in tests/integration/test_transactions.py)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from kspout.config import parse_config
from kspout.errors import KafkaRequestFailed, KafkaUnavailable
from kspout.kafka import KafkaMetadata
from kspout.kafka.transactions import (
    AFTER_FAILURE,
    CHECK_EVERY,
    OpenTransaction,
    TransactionProbe,
    TransactionWatch,
)

CONFIG = parse_config(
    {"topic": "t", "spout_id": "s", "brokers": "127.0.0.1:1", "zookeeper": "127.0.0.1:2"}
)


class Probe(TransactionProbe):
    """Answers from `open` (partition -> transaction) and notes what it was asked."""

    def __init__(self) -> None:
        super().__init__(CONFIG)
        self.open: dict[int, OpenTransaction] = {}
        self.asked: list[dict[int, int]] = []
        self.down = False

    def open_above(
        self, stable: Mapping[int, int], known: Mapping[int, OpenTransaction] | None = None
    ) -> dict[int, OpenTransaction]:
        if self.down:
            raise KafkaUnavailable("no broker answered")
        if stable:
            self.asked.append(dict(stable))
        return {p: t for p, t in self.open.items() if stable.get(p) == t.stable}


class Metadata(KafkaMetadata):
    """Answers each partition's LSO (`read_committed` high) from `stable`."""

    def __init__(self) -> None:
        super().__init__(CONFIG)
        self.stable: dict[int, int] = {}

    def watermarks_now(
        self, topic: str, partitions: Iterable[int], lows: Mapping[int, int] | None = None
    ) -> tuple[dict[int, tuple[int, int]], dict[int, KafkaRequestFailed]]:
        return {p: (0, self.stable[p]) for p in partitions}, {}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def watch() -> tuple[TransactionWatch, Probe, Clock, Metadata]:
    probe, clock, metadata = Probe(), Clock(), Metadata()
    metadata.stable = {p: 20 for p in range(4)}
    return TransactionWatch(CONFIG, clock, metadata, probe=probe), probe, clock, metadata


def test_only_partitions_caught_up_at_an_unmoved_lso_are_asked_every_check() -> None:
    w, probe, clock, _metadata = watch()
    held = OpenTransaction(stable=20, written=35, since_ms=1_000)
    probe.open = {0: held}

    w.observe({0: 20, 1: 30})  # first look: nothing known to stand still yet
    assert probe.asked == [] and w.waiting == {}
    clock.now = CHECK_EVERY / 2
    w.observe({0: 20, 1: 30})  # between looks: not asked
    assert probe.asked == []
    clock.now = CHECK_EVERY
    w.observe({0: 20, 1: 31, 2: 5})  # 1 moved, 2 just caught up: only 0 stood still
    assert probe.asked == [{0: 20}]
    assert w.waiting == {0: held}

    clock.now += 1
    w.observe({0: 20, 1: 31})  # between looks the answer holds
    assert w.waiting == {0: held} and len(probe.asked) == 1
    w.observe({0: 36, 1: 31})  # the LSO moved: not waiting, without asking
    assert w.waiting == {} and len(probe.asked) == 1


def test_a_partition_with_a_backlog_is_never_asked() -> None:
    w, probe, clock, _metadata = watch()
    for step in range(5):
        clock.now = step * CHECK_EVERY
        w.observe({})  # nothing caught up
    assert probe.asked == []


def test_kafka_down_keeps_the_last_answer_and_asks_again_later() -> None:
    w, probe, clock, _metadata = watch()
    held = OpenTransaction(stable=20, written=35, since_ms=1_000)
    probe.open = {0: held}
    w.observe({0: 20})
    clock.now = CHECK_EVERY
    w.observe({0: 20})
    assert w.waiting == {0: held}
    probe.down = True
    clock.now = 2 * CHECK_EVERY
    w.observe({0: 20})
    assert w.waiting == {0: held}
    probe.down = False
    clock.now += AFTER_FAILURE - 1
    w.observe({0: 20})
    assert len(probe.asked) == 1  # not yet
    clock.now += 1
    w.observe({0: 20})
    assert len(probe.asked) == 2 and w.waiting == {0: held}


def test_a_stale_lso_is_not_taken_for_an_open_transaction() -> None:
    """A paused partition's known high is not asked again: records written since look like an
    open transaction to the probe, until its LSO is asked again."""
    w, probe, clock, metadata = watch()
    probe.open = {0: OpenTransaction(stable=20, written=50, since_ms=1_000)}
    metadata.stable[0] = 50  # everything up to 50 is committed: 20 was stale
    w.observe({0: 20})
    clock.now = CHECK_EVERY
    w.observe({0: 20})
    assert probe.asked == [{0: 20}]
    assert w.waiting == {}
