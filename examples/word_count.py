"""`python -m examples.word_count`: Storm's word count with columnar bolts, on the embedded
stack and Spark `local[2]`.

Run it from the repository root in the set-up virtualenv. It produces sentences, then runs
`SplitWords() -> Fields("word") -> StoredCounts(...)`: both bolts are `ColumnarBolt`s
(`kspout_demo.word_count`), which take each task's whole batch as Arrow columns. The split bolt
emits one row per word anchored to its sentence's row; the count bolt counts a batch's words in
one pass and adds them to a Redis hash when its task ends. It prints the counts and checks them
against what was produced; every sentence is acked and the commit points reach the end.
"""

from __future__ import annotations

import os
import random
import sys
import tempfile
from collections import Counter
from pathlib import Path

import redis
from confluent_kafka import Producer

from kspout import Fields, KafkaSpout
from kspout.config import parse_config
from kspout.devstack import DevStack
from kspout.executor.topology import ChainItem
from kspout.kafka import client_settings
from kspout.spark import spark_session
from kspout_demo.word_count import CountWords, SplitWords

SENTENCES = 20_000
WORDS = ("the", "cow", "jumped", "over", "moon", "an", "apple", "a", "day")


class StoredCounts(CountWords):
    """`CountWords`, adding the task's counts to a Redis hash in one round trip at its end
    (a task's acks leave only after `cleanup` returned, so a failed write acks nothing)."""

    def __init__(self, redis_url: str, key: str) -> None:
        self.redis_url = redis_url
        self.key = key

    def cleanup(self) -> None:
        with redis.Redis.from_url(self.redis_url) as client, client.pipeline() as pipe:
            for word, n in self.counts.items():
                pipe.hincrby(self.key, word, n)
            pipe.execute()


def main() -> bool:
    """Run the example; True when every check passed."""
    repo = str(Path(__file__).resolve().parent.parent)  # Spark's Python workers import it
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")]))
    with (
        tempfile.TemporaryDirectory(prefix="kspout-word-count-") as workdir,
        DevStack(Path(workdir)) as stack,
    ):
        os.environ.update(stack.info.env())
        config = parse_config({"topic": "sentences", "spout_id": "word-count"})
        rng = random.Random(1)
        true_counts: Counter[str] = Counter()
        producer = Producer(client_settings(config))
        for n in range(SENTENCES):
            words = rng.choices(WORDS, k=rng.randint(1, 6))
            true_counts.update(words)
            producer.produce(config.topic, " ".join(words).encode(), str(n).encode())
            producer.poll(0)
        producer.flush(30)
        spark = spark_session(
            "local[2]", "kspout columnar word count", {"spark.ui.enabled": "false"}
        )
        spark.sparkContext.setLogLevel("ERROR")
        key = "word-count:counts"
        try:
            chain: list[ChainItem] = [
                SplitWords(),
                Fields("word"),
                StoredCounts(stack.info.redis_url, key),
            ]
            final = KafkaSpout(config, spark).run(chain, until_caught_up=True)
        finally:
            spark.stop()
        with redis.Redis.from_url(stack.info.redis_url, decode_responses=True) as client:
            counts = Counter({word: int(n) for word, n in client.hgetall(key).items()})
        print(f"{SENTENCES} sentences, acked {final.total('acked')}, lag {final.lag}")
        for word, n in counts.most_common():
            print(f"{word:>8} {n}")
        checks = {
            "every sentence acked": final.total("acked") == SENTENCES,
            "the counts equal the words produced": counts == true_counts,
        }
        for name, ok in checks.items():
            print(f"{'OK  ' if ok else 'FAIL'} {name}")
        return all(checks.values())


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
