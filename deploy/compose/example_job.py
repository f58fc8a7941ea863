"""The example job of the compose stack and the Kubernetes manifests: a word count, exactly once.

Each message's words are counted with the dedup bolt in front, so a replay (a retry, a restart,
a timed-out original that finished after all) never counts a message twice:

* `--handler example_job:chain`: the counts go to the Redis hash `example:word_counts`,
  applied by one Lua call together with marking the message DONE;
* `--handler example_job:sql_chain`: the counts go to the PostgreSQL table
  `example_word_counts` through the fenced SQL sink (`dedup.postgres.PostgresSink`), which
  commits a message's rows at most once. Its connection comes from `KSPOUT_EXAMPLE_PG`
  (libpq `key=value` settings) and the password from the file `KSPOUT_EXAMPLE_PG_PASSWORD_FILE`;
  both are read on the driver, and the settings travel to the executors inside the bolt.

The dedup bolt takes the topic's config, so both are built when `kspout run` looks them up on
the driver, from the topic file deploy/job.py names in `KSPOUT_CONFIG`. Executors unpickle the
bolt and import this module (shipped with `--py-files`) without building anything.

`python example_job.py produce --messages N` writes N keyed sentences to the topic (the compose
stack's `seed` service runs it once).
"""

from __future__ import annotations

import argparse
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REDIS_KEY = "example:word_counts"
SQL_TABLE = "example_word_counts"
WORDS = (
    "storm", "spark", "kafka", "stream", "bolt", "spout", "tuple", "offset", "partition",
    "replay", "acker", "commit", "retry", "lease", "token", "epoch", "redis", "zookeeper",
)  # fmt: skip


def words(record: Any) -> list[str]:
    return bytes(record.value or b"").decode("utf-8", "replace").split()


def count_words(record: Any, effects: Any) -> None:
    """The Redis handler: one HINCRBY per word, applied atomically with the message's DONE."""
    for word in words(record):
        effects.hincrby(REDIS_KEY, word)


@dataclass(frozen=True)
class CountWordsInPostgres:
    """The SQL handler: the message's words in one fenced transaction."""

    sink: Any  # dedup.postgres.PostgresSink

    def __call__(self, record: Any, effects: Any) -> None:
        rows = [(word,) for word in words(record)]

        def apply(cur: Any) -> None:
            cur.executemany(
                f"INSERT INTO {SQL_TABLE} (word, n) VALUES (%s, 1) "
                f"ON CONFLICT (word) DO UPDATE SET n = {SQL_TABLE}.n + 1",
                rows,
            )

        self.sink.write(effects, apply)


def _config() -> Any:
    from kspout.config import load_config

    path = os.environ.get("KSPOUT_CONFIG")
    if not path:
        raise RuntimeError("KSPOUT_CONFIG names no topic file (deploy/job.py sets it)")
    return load_config(path)


def _make_chain() -> Any:
    from dedup import IdempotencyBolt

    return IdempotencyBolt(count_words, _config())


def _make_sql_chain() -> Any:
    import psycopg
    from psycopg.conninfo import make_conninfo

    from dedup import IdempotencyBolt
    from dedup.postgres import PostgresSink

    config = _config()
    password: dict[str, str] = {}
    password_file = os.environ.get("KSPOUT_EXAMPLE_PG_PASSWORD_FILE")
    if password_file:
        password["password"] = Path(password_file).read_text().removesuffix("\n")
    conninfo = make_conninfo(os.environ.get("KSPOUT_EXAMPLE_PG", ""), **password)
    sink = PostgresSink(conninfo, namespace=config.spout_id)
    sink.create_table()  # once, on the driver, before any executor writes
    with psycopg.connect(sink.conninfo, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE IF NOT EXISTS {SQL_TABLE} (word text PRIMARY KEY, n bigint)")
    return IdempotencyBolt(CountWordsInPostgres(sink), config)


HANDLERS = {"chain": _make_chain, "sql_chain": _make_sql_chain}


def __getattr__(name: str) -> Any:
    """`example_job.chain` and `example_job.sql_chain`, built when looked up (on the driver)."""
    if name in HANDLERS:
        return HANDLERS[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def produce(messages: int, partitions: int, seed: int = 11) -> None:
    """Write `messages` sentences keyed `msg-<n>` (the dedup id: `[dedup] id_source = "key"`)."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    from kspout.kafka import client_settings

    config = _config()
    admin = AdminClient(client_settings(config))
    for future in admin.create_topics([NewTopic(config.topic, partitions)]).values():
        try:
            future.result()
        except Exception as exc:  # already there, or a broker that auto-creates topics
            print(f"example_job: topic {config.topic}: {exc}")
    rng = random.Random(seed)
    producer = Producer(client_settings(config, **{"linger.ms": 20}))
    for n in range(messages):
        sentence = " ".join(rng.choices(WORDS, k=rng.randint(3, 8)))
        producer.produce(config.topic, key=f"msg-{n}", value=sentence)
        producer.poll(0)
    left = producer.flush(60)
    if left:
        raise SystemExit(f"example_job: {left} messages not delivered")
    print(f"example_job: produced {messages} messages to {config.topic}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="The example job's producer.")
    parser.add_argument("command", choices=["produce"])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--partitions", type=int, default=4)
    args = parser.parse_args()
    produce(args.messages, args.partitions)
