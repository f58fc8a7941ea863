"""The nemesis's own ledger: what it produced, written as it produced it, never read back
from kspout's records.

The messages are the demo's sentences (`kspout_demo.jobs`): JSON `{"id": n, "text": "...",
"inject": kind}`, keyed by the id. `kind` is `none` (healthy), `poison` (`CountOnce` raises on
every attempt: dead-lettered for its own fault) or `noid` (no key, so the dedup bolt cannot
name it: dead-lettered as invalid). A `Feed` produces them on a thread, spread evenly over the
run, through an idempotent producer with `acks=all` (so a broker's death neither loses nor
doubles one); a message counts as produced once Kafka acknowledged it.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from confluent_kafka import Producer

from kspout_demo.jobs import WORDS

POISON_SHARE = 0.002  # of the messages, at least MIN_EACH
NOID_SHARE = 0.001
MIN_EACH = 3
PACE = 0.1  # seconds between the feed's rounds
TRICKLE = 5.0  # messages a second from the reserve, once the even part is out
RESERVE = 0.1  # of the messages, at most `TRICKLE` times 2 minutes


@dataclass
class Ledger:
    """Every message the nemesis made, and what its healthy ones must add to the counts."""

    kinds: dict[int, str] = field(default_factory=dict)  # id -> none | poison | noid
    counts: Counter[str] = field(default_factory=Counter)  # word counts of the healthy ones
    acknowledged: int = 0  # delivery reports without an error
    refused: list[str] = field(default_factory=list)  # delivery reports with one

    def ids(self, *kinds: str) -> set[int]:
        return {i for i, kind in self.kinds.items() if kind in kinds}


def sentences(messages: int, seed: int) -> list[tuple[int, str, str]]:
    """`(id, kind, text)` of every message, drawn from `seed`."""
    rng = random.Random(seed)
    shares = {"poison": POISON_SHARE, "noid": NOID_SHARE}
    kinds = ["none"] * messages
    free = list(range(messages))
    for kind, share in shares.items():
        for n in rng.sample(free, min(len(free), max(MIN_EACH, round(messages * share)))):
            kinds[n] = kind
        free = [n for n in free if kinds[n] == "none"]
    return [
        (n, kinds[n], " ".join(rng.choices(WORDS, k=rng.randint(3, 8)))) for n in range(messages)
    ]


class Feed:
    """Produces the messages on a thread into `ledger`: all but a reserve evenly over
    `seconds`; then the reserve at `TRICKLE` messages a second until `finish()` (the last fault
    struck), and what is left of it at once. Faults that run late still meet work: a hung
    handler needs a message to hang on."""

    def __init__(
        self, brokers: str, topic: str, messages: int, seconds: float, seed: int, ledger: Ledger
    ) -> None:
        self.topic = topic
        self.seconds = seconds
        self.ledger = ledger
        self.plan = sentences(messages, seed)
        self.producer = Producer(
            {
                "bootstrap.servers": brokers,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 5,
                "log_level": 0,  # a killed broker's reconnects are the nemesis's doing
            }
        )
        self.thread = threading.Thread(target=self._run, name="nemesis-feed", daemon=True)
        self.error: BaseException | None = None
        self.reserve = min(int(messages * RESERVE), int(TRICKLE * 120))
        self._finish = threading.Event()

    def start(self) -> None:
        self.thread.start()

    def finish(self) -> None:
        """Send what is left of the reserve at once."""
        self._finish.set()

    def join(self, timeout: float) -> None:
        """Wait for the feed's end (every message acknowledged or refused), after `finish()`."""
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise TimeoutError(f"the feed did not finish within {timeout:g} s of its end")
        if self.error is not None:
            raise self.error

    def _delivered(self, err: object, _msg: object) -> None:
        if err is None:
            self.ledger.acknowledged += 1
        else:
            self.ledger.refused.append(str(err))

    def _run(self) -> None:
        try:
            began = time.monotonic()
            sent = 0
            even = len(self.plan) - self.reserve
            while sent < len(self.plan):
                elapsed = time.monotonic() - began
                due = even * min(1.0, elapsed / self.seconds)
                if self._finish.is_set():
                    due = len(self.plan)
                elif elapsed > self.seconds:
                    due += TRICKLE * (elapsed - self.seconds)
                for n, kind, text in self.plan[sent : max(sent, int(due))]:
                    self._send(n, kind, text)
                    sent += 1
                self.producer.poll(PACE)
            if self.producer.flush(120) != 0:
                raise TimeoutError("messages still unacknowledged 120 s after the last was sent")
        except BaseException as exc:
            self.error = exc

    def _send(self, n: int, kind: str, text: str) -> None:
        value = json.dumps({"id": n, "text": text, "inject": kind}).encode()
        key = None if kind == "noid" else str(n).encode()
        self.ledger.kinds[n] = kind
        if kind == "none":
            self.ledger.counts.update(text.split())
        while True:
            try:
                self.producer.produce(self.topic, value, key, on_delivery=self._delivered)
                return
            except BufferError:  # the local queue is full (a broker is down): let it drain
                self.producer.poll(0.1)
