"""`foreach_batch` acks only what `f` received, with real fetches cut short by Kafka.

Deleting records (Kafka's DeleteRecords, what retention does to old segments) while `f` runs
moves a partition's low watermark past offsets the batch planned: the executors' fetch then
stops at OFFSET_OUT_OF_RANGE. Those offsets were never in the frame, so they must not be
acked; they go to the partition's out-of-range policy (counted lost, with exact ranges, or
fetched again when Kafka still has them). Offsets Kafka never had (transaction markers) are
GONE.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from confluent_kafka import Producer
from pyspark.sql import DataFrame, SparkSession

from kspout import KafkaSpout
from kspout.config import TopicConfig
from kspout.contract import PartitionTask, TaskResult
from kspout.devstack import DevStack
from kspout.outcomes import OutcomeKind
from kspout.partition_manager import Plan, Span
from kspout.spark import FrameExecutor
from tests.integration.helpers import delete_records, produce, stored, watermarks

CUT = 400  # `f` deletes the records below this offset of partition 0


def offsets_of(result: TaskResult, kind: OutcomeKind) -> list[int]:
    return [
        o
        for out in result.outcomes
        if out.kind is kind
        for o in range(out.offset, out.offset + out.count)
    ]


def produce_transactions(brokers: str, topic: str, partition: int) -> None:
    """Three committed transactions of three records: offsets 3, 7 and 11 are markers."""
    producer = Producer({"bootstrap.servers": brokers, "transactional.id": f"{topic}-txn"})
    producer.init_transactions(30)
    for txn in range(3):
        producer.begin_transaction()
        for i in range(3):
            producer.produce(topic, value=b"t%d-%d" % (txn, i), partition=partition)
        producer.commit_transaction(30)


def test_a_task_acks_exactly_the_offsets_whose_rows_f_saw(
    spark: SparkSession,
    stack: DevStack,
    make_config: Callable[..., TopicConfig],
    producer: Producer,
) -> None:
    """One batch, four partitions, driven through `FrameExecutor` directly:

    * 0: planned [100, 1000); `f` deletes the records below 400 before it evaluates the frame,
      so low moves past 150 and the fetch is cut at its first offset;
    * 1: planned [100, 1000) while Kafka holds [0, 600): the fetch reads 100..599 and is cut at
      high; `f` then produces 600 more, so a watermark query after `f` covers the whole plan;
    * 2: transaction markers at 3, 7 and 11 inside the plan [0, 12): GONE, not acked;
    * 3: an ordinary plan [0, 50): all acked.
    """
    config = make_config(out_of_range="earliest")
    topic = config.topic
    produce(producer, topic, {0: range(1000), 1: range(600), 3: range(50)})
    produce_transactions(stack.info.brokers, topic, 2)
    plans = {0: (100, 1000), 1: (100, 1000), 2: (0, 12), 3: (0, 50)}
    tasks = [
        PartitionTask(topic, p, Plan((Span(a, b, 1),), generation=0)) for p, (a, b) in plans.items()
    ]
    seen: dict[int, list[int]] = defaultdict(list)
    low_before_evaluation: list[int] = []

    def f(df: DataFrame, batch_id: int) -> None:
        delete_records(config.brokers, topic, {0: CUT})
        low_before_evaluation.append(watermarks(config)[0][0])
        for row in df.select("partition", "offset").collect():
            seen[row.partition].append(row.offset)
        produce(producer, topic, {1: range(600, 1200)})

    executor = FrameExecutor(spark, config, f)
    try:
        results = {r.partition: r for r in executor.submit(0, tasks).result(timeout=120)}
    finally:
        executor.close()

    ((low,),) = [low_before_evaluation]
    assert 150 < low < 1000, f"retention should have moved low into the plan, it is {low}"
    assert watermarks(config)[1] == (0, 1200)  # a query now would cover all of [100, 1000)
    acked = {p: offsets_of(result, OutcomeKind.ACK) for p, result in results.items()}
    assert acked == {p: sorted(seen[p]) for p in plans}  # by partition

    assert seen[0] == []  # the fetch was cut at 100, below low
    # Nothing of it was acked: it is released (no attempt spent) for the out-of-range policy.
    assert offsets_of(results[0], OutcomeKind.RELEASED) == list(range(100, 1000))
    assert results[0].out_of_range is not None and results[0].out_of_range[0] >= low

    assert sorted(seen[1]) == list(range(100, 600))
    assert results[1].out_of_range == (0, 600)  # what the cut fetch saw

    assert sorted(seen[2]) == [0, 1, 2, 4, 5, 6, 8, 9, 10]
    assert offsets_of(results[2], OutcomeKind.GONE) == [3, 7, 11]
    assert results[2].out_of_range is None

    assert sorted(seen[3]) == list(range(50))
    assert results[3].out_of_range is None


def test_foreach_batch_counts_what_retention_took_as_lost_never_as_acked(
    spark: SparkSession, make_config: Callable[..., TopicConfig], producer: Producer
) -> None:
    """The first call of `f` produces 600 more and deletes the records below 400 before it
    evaluates its frame [0, 1000): low moves into the batch and the fetch is cut at 0. With
    `out_of_range = "earliest"`, the offsets below low are lost (exactly those), the rest of the
    batch is released (no attempt spent) and comes again, and every offset `f` received, and
    only those, is acked."""
    config = make_config(out_of_range="earliest", batch_size=1000, message_timeout=5.0)
    topic = config.topic
    produce(producer, topic, {0: range(1000)})
    received: set[int] = set()
    calls: list[int] = []

    def f(df: DataFrame, batch_id: int) -> None:
        if not calls:
            produce(producer, topic, {0: range(1000, 1600)})
            delete_records(config.brokers, topic, {0: CUT})
        calls.append(batch_id)
        for row in df.select("partition", "offset").collect():
            assert row.partition == 0
            received.add(row.offset)

    progress = KafkaSpout(config, spark).foreach_batch(f, until_caught_up=True)

    low, high = watermarks(config)[0]
    assert low == CUT and high == 1600
    stats = next(view.stats for view in progress.partitions if view.partition == 0)
    assert received == set(range(low, high))
    assert stats.acked == len(received)
    assert stats.lost == high - len(received) == low
    ((partition, reset),) = progress.resets
    assert partition == 0 and reset.lost == ((0, low),)
    assert stored(config)[0] == high
