"""`TransactionWatch`: which partitions it asks about, and when; a probe stands in for Kafka
(the real one is tried in tests/integration/test_transactions.py)."""

from __future__ import annotations

from collections.abc import Mapping

from kspout.config import parse_config
from kspout.errors import KafkaUnavailable
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


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def watch() -> tuple[TransactionWatch, Probe, Clock]:
    probe, clock = Probe(), Clock()
    return TransactionWatch(CONFIG, clock, probe=probe), probe, clock


def test_only_partitions_caught_up_at_an_unmoved_lso_are_asked_every_check() -> None:
    w, probe, clock = watch()
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
    w, probe, clock = watch()
    for step in range(5):
        clock.now = step * CHECK_EVERY
        w.observe({})  # nothing caught up
    assert probe.asked == []


def test_kafka_down_keeps_the_last_answer_and_asks_again_later() -> None:
    w, probe, clock = watch()
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
