"""The job of the broker fault tests (tests/chaos/test_broker_faults.py), and its ledger.

Every message is JSON `{"id": ..., "kind": "ok" | "poison"}` keyed by its id. The handler runs
behind the dedup bolt; for an `ok` message it

1. counts the run in `<topic>:runs` (a plain INCR: the test strikes when this count shows a
   batch near its end) and sleeps `pace` seconds (no fault: a backlog lasts long enough for
   a broker to go down in it),
2. publishes one output record through `KafkaOutput` (its `kspout.id` header is derived from
   the message id) and flushes it, so the message succeeds only once Kafka acknowledged it,
3. adds `HINCRBY <topic>:applied <id> 1` to its effects: applied by the dedup bolt atomically
   with marking the id DONE, i.e. durably and only after the whole message succeeded.

A `poison` message raises on every attempt (its own fault: it must end on the dead-letter topic
after `max_retries`). Every run that raises is counted, per id, in `<topic>:raised` (a plain
write before raising, with the error's class in `<topic>:errors`), so the test can tell a
healthy message whose output was not acknowledged during an outage (`OutputUnavailable`:
released, no attempt spent) from the poison ones.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from dedup import Effects
from kspout.kafka import Record
from kspout.output import KafkaOutput
from tests.chaos.faults import worker_redis

KINDS = ("ok", "poison")


def encode(id_: str, kind: str = "ok") -> bytes:
    assert kind in KINDS, kind
    return json.dumps({"id": id_, "kind": kind}).encode()


@dataclass(frozen=True, slots=True)
class PublishOnce:
    """The dedup bolt's handler: one output record and one Redis effect per `ok` message."""

    topic: str
    redis_url: str
    output: KafkaOutput
    pace: float = 0.0

    def __call__(self, record: Record, effects: Effects) -> None:
        message = json.loads(record.value or b"{}")
        try:
            if message["kind"] == "poison":
                raise RuntimeError(f"poison message {message['id']}")
            worker_redis(self.redis_url).incr(f"{self.topic}:runs")
            if self.pace:
                time.sleep(self.pace)
            self.output.send(record, message["id"].encode(), key=record.key, source_id=effects.id)
            self.output.flush()
        except Exception as exc:
            client = worker_redis(self.redis_url)
            client.hincrby(f"{self.topic}:raised", effects.id, 1)
            client.hset(f"{self.topic}:errors", effects.id, type(exc).__name__)
            raise
        effects.hincrby(f"{self.topic}:applied", effects.id)
