"""What each `kspout run` instance of the nemesis runs: the demo's exactly-once job
(`kspout_demo.jobs.CountOnce` behind the dedup bolt, its effects in Redis), with a log of the
handler's attempts and a hang on demand.

    kspout run --config <topic file> --handler bench.nemesis.job:bolt

Read from the environment when the module is imported (by `kspout run --handler`):

* `NEMESIS_CONFIG`: the topic file, the same one as `--config` (the bolt needs the config);
* `NEMESIS_ATTEMPTS`: this process's attempt log. Each batch that reaches the bolt appends
  `D <time> <id>,<id>,...` (the messages delivered, whether the bolt runs them or finds them
  done), and each handler run `A <id> <attempt> <time>` as it starts; each line in one
  `write` to an `O_APPEND` file, so a SIGKILL leaves whole lines;
  a hang adds `hang <id> <start>` before it sleeps and `woke <id> <end>` after (times are
  `time.monotonic()`, one clock for every process of the machine);
* `NEMESIS_HANG`: a flag file. The first handler run that finds it takes it (an atomic rename,
  so exactly one run does) and sleeps for the seconds it holds, past `message_timeout`: the
  hung handler the nemesis asks for.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

from dedup import Effects, IdempotencyBolt
from kspout.bolts import Collector, Tuple
from kspout.config import TopicConfig, load_config
from kspout.kafka import Record
from kspout_demo.jobs import CountOnce


@cache
def _log(path: str) -> int:
    """The attempt log's descriptor, opened once per process."""
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)


def note(path: str, line: str) -> None:
    """Append one line to the attempt log (one `write`: never half a line)."""
    os.write(_log(path), f"{line}\n".encode())


def take_hang(flag: str) -> float | None:
    """The seconds to hang if this run took the flag file, else None."""
    taken = f"{flag}.{os.getpid()}"
    try:
        os.rename(flag, taken)
    except FileNotFoundError:
        return None
    with open(taken) as f:
        return float(f.read())


@dataclass(frozen=True, slots=True)
class Attempted:
    """`CountOnce`, each run logged first; the run that takes the hang flag sleeps first."""

    inner: CountOnce
    attempts: str  # the attempt log's path
    hang_flag: str

    def __call__(self, record: Record, effects: Effects) -> None:
        note(self.attempts, f"A {effects.id} {effects.attempt} {time.monotonic():.3f}")
        seconds = take_hang(self.hang_flag)
        if seconds is not None:
            note(self.attempts, f"hang {effects.id} {time.monotonic():.3f}")
            time.sleep(seconds)
            note(self.attempts, f"woke {effects.id} {time.monotonic():.3f}")
        self.inner(record, effects)


class Delivered(IdempotencyBolt):
    """The dedup bolt, unchanged, each batch's message ids logged as it arrives."""

    def __init__(self, handler: Attempted, config: TopicConfig) -> None:
        super().__init__(handler, config)
        self.attempts = handler.attempts

    def execute_batch(self, tuples: Sequence[Tuple], collector: Collector) -> None:
        ids = ",".join(t.record.key.decode() for t in tuples if t.record.key is not None)
        note(self.attempts, f"D {time.monotonic():.3f} {ids}")
        super().execute_batch(tuples, collector)


def make_bolt() -> IdempotencyBolt:
    """The logged dedup bolt around the logged `CountOnce`, from the environment (see above)."""
    config = load_config(os.environ["NEMESIS_CONFIG"])
    job = CountOnce(config.spout_id, slow_seconds=0.0)
    handler = Attempted(job, os.environ["NEMESIS_ATTEMPTS"], os.environ["NEMESIS_HANG"])
    return Delivered(handler, config)


bolt = make_bolt()
