"""Broker faults that only a real Kafka broker allows: a broker SIGKILLed and started again
with its data, a partition leader SIGKILLed in a replicated cluster, a broker SIGSTOPped past
every request timeout.

Each test runs its own Kafka (a `KafkaBroker` or `KafkaCluster` in a temporary folder, so the
session's broker and the other tests never see the fault; ZooKeeper and Redis are the session
stack's) and drives kspout in-process, the way `kspout run` does (`Driver` with the
`LocalExecutor`, in a thread of the test), with the dedup bolt around a handler that publishes
one output record per message through `KafkaOutput` (tests/chaos/broker_faults_jobs.py). Some
messages are poison (they raise on every attempt) and must end on the dead-letter topic.

The fault strikes the very process the test names while a paced backlog is being worked
through (near the end of a batch), and the test shows it struck: a partition's circuit
breaker opened in the driver's progress reports, or output sends in flight were refused (the
handler's own ledger), and for the leader kill Kafka's `describe_topics` names another leader.
Then, against the test's own ledger only (what it produced, per delivery report; the
effects the dedup bolt applied with each DONE mark; the output and dead-letter topics read back
from Kafka; the handler's own count of runs that raised):

* every healthy message's effect was applied exactly once, and none is missing;
* every healthy message has an output record (by its `kspout.id`), poison ones none, and none
  is written twice except a send Kafka did not acknowledge in time (in doubt: the retry sends
  it again under the same `kspout.id`, for the next stage's dedup);
* every poison message is dead-lettered exactly once, and no healthy one is;
* each poison message ran exactly its budget, and every retry the run counted is a poison
  message's: no fetch, watermark query, dead-letter write or output send that failed for the
  outage spent an attempt (a healthy message whose output send was in flight is released,
  `OutputUnavailable`, and runs again once Kafka is back);
* the run finished by itself (`until_caught_up`), without a restart of kspout, with the commit
  points at the high watermarks.

No timing is asserted; every wait is bounded.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
import redis
from confluent_kafka import (
    Consumer,
    KafkaException,
    Message,
    Producer,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from dedup import IdempotencyBolt
from kspout.config import TopicConfig, parse_config
from kspout.devstack import DevStack, create_topic
from kspout.devstack.kafka_broker import KafkaBroker, KafkaCluster
from kspout.driver import Driver, Progress
from kspout.driver.cluster_checks import check_cluster
from kspout.executor.local import LocalExecutor
from kspout.kafka import KafkaMetadata
from kspout.outcomes import describe_error
from kspout.output import ID_HEADER, KafkaOutput
from tests.chaos.broker_faults_jobs import PublishOnce, encode
from tests.integration.helpers import FAST_BACKOFF, stored

ZK_ROOT = "/broker-faults"
PARTITIONS = (0, 1, 2, 3)
PER_PARTITION = 90
POISON_AT = (10, 60)  # the i-th message of every partition is poison
MAX_RETRIES = 2
PACE = 0.01  # seconds per healthy message: the backlog outlasts the moment the fault strikes
FETCH_TIMEOUT = 2.0
OUTAGE = 20.0  # seconds the killed broker stays down
FREEZE = 12.0  # seconds the frozen broker stays stopped: past REQUEST_TIMEOUT (10 s)
LIMIT = 150.0  # seconds a run may take to finish once its fault is over


# -- the brokers ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def own_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """A single KRaft broker of this module's own (the session's broker is never touched)."""
    broker = KafkaBroker(tmp_path_factory.mktemp("own-kafka"))
    broker.start()
    yield broker
    if broker.running:
        broker.thaw()  # a test that failed while it was frozen must not leave it stopped
    broker.stop()


# -- the ledger ----------------------------------------------------------------------------------


@dataclass
class Job:
    """One test's topics, config and ledger of what it produced."""

    config: TopicConfig
    output_topic: str
    ids: dict[tuple[int, int], str] = field(default_factory=dict)  # (partition, offset) -> id
    poison: set[str] = field(default_factory=set)

    @property
    def healthy(self) -> set[str]:
        return set(self.ids.values()) - self.poison


def job_config(stack: DevStack, brokers: str, topic: str) -> TopicConfig:
    return parse_config(
        {
            "topic": topic,
            "spout_id": f"bf-{uuid.uuid4().hex[:8]}",
            "topology_name": "broker-faults",
            "zk_root": ZK_ROOT,
            "brokers": brokers,
            "zookeeper": stack.info.zookeeper,
            "batch_size": 40,
            "max_batches_in_flight": 2,
            "max_retries": MAX_RETRIES,
            "retry_backoff": FAST_BACKOFF,
            # The breaker probes a down broker every second at most: recovery is quick.
            "infra_backoff": {"initial": 0.2, "multiplier": 2.0, "max": 1.0},
            "commit_interval": 0.2,
            "fetch_timeout": FETCH_TIMEOUT,
            # In-process batches end before the driver looks again: no timeouts to blame.
            "message_timeout": 120.0,
            "defer_delay": 0.5,
            "redis": {"url": stack.info.redis_url},
            "dedup": {"id_source": "key", "lease": 30.0},
            "kafka": {"log_level": 0},  # clients of a dead broker log every reconnect
        }
    )


def make_job(stack: DevStack, brokers: str, name: str, replication: int = 1) -> Job:
    """Topics of its own (source, dead letters, output) on `brokers`, and the config."""
    topic = f"bf-{name}-{uuid.uuid4().hex[:8]}"
    config = job_config(stack, brokers, topic)
    settings = {"min.insync.replicas": "2"} if replication > 1 else {}
    create_topic(brokers, topic, len(PARTITIONS), replication=replication, config=settings)
    create_topic(brokers, config.dlq_topic, 1, replication=replication, config=settings)
    output = f"{topic}.out"
    create_topic(brokers, output, len(PARTITIONS), replication=replication, config=settings)
    return Job(config, output)


def produce(job: Job, prefix: str) -> None:
    """`PER_PARTITION` messages to every partition, poison at `POISON_AT`; their offsets come
    from the delivery reports."""
    failed: list[str] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            failed.append(str(err))
        else:
            job.ids[(msg.partition(), msg.offset())] = msg.key().decode()

    producer = Producer({"bootstrap.servers": job.config.brokers, "linger.ms": 5, "acks": "all"})
    for partition in PARTITIONS:
        for i in range(PER_PARTITION):
            id_ = f"{prefix}-p{partition}-{i}"
            kind = "poison" if i in POISON_AT else "ok"
            if kind == "poison":
                job.poison.add(id_)
            producer.produce(
                job.config.topic,
                encode(id_, kind),
                id_.encode(),
                partition=partition,
                on_delivery=delivered,
            )
            producer.poll(0)
    assert producer.flush(30) == 0 and not failed, f"produce failed: {failed[:3]}"
    assert len(job.ids) == len(PARTITIONS) * PER_PARTITION


def read_all(brokers: str, topic: str) -> list[Message]:
    """Every record of `topic`, read up to each partition's high watermark."""
    consumer = Consumer(
        {
            "bootstrap.servers": brokers,
            "group.id": f"bf-check-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    try:
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        highs = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), 10)[1] for p in parts}
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        found: list[Message] = []
        read = dict.fromkeys(parts, 0)
        deadline = time.monotonic() + 30
        while any(read[p] < highs[p] for p in parts):
            assert time.monotonic() < deadline, f"{topic}: read {read} of {highs}"
            for message in consumer.consume(500, 0.5):
                if message.error() is None:
                    found.append(message)
                    read[message.partition()] = message.offset() + 1
        return found
    finally:
        consumer.close()


def headers_of(message: Message) -> dict[str, str]:
    pairs = cast(list[tuple[str, bytes]], message.headers() or [])
    return {name: value.decode() for name, value in pairs}


def hash_counts(client: redis.Redis, key: str) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in client.hgetall(key).items()}


# -- the run -------------------------------------------------------------------------------------


class DriverThread:
    """The driver loop with the in-process executor (what `kspout run` runs), in a thread, run
    until caught up; it keeps every progress report's open breakers."""

    def __init__(self, job: Job) -> None:
        config = job.config
        output = KafkaOutput(config, job.output_topic)
        handler = PublishOnce(config.topic, config.redis.url, output, PACE)
        bolt = IdempotencyBolt(handler, config)
        self.stop_event = threading.Event()
        self.progress: Progress | None = None
        self.latest: Progress | None = None
        self.error: BaseException | None = None
        self.breakers: dict[int, int] = {}  # partition -> most infrastructure failures seen
        self.states: Counter[str] = Counter()  # partition statuses seen in progress reports

        def main() -> None:
            try:
                with Driver(
                    config,
                    LocalExecutor(config, bolt),
                    on_progress=self._report,
                    progress_interval=0.1,
                    replay_window=bolt.replay_window(),
                ) as driver:
                    self.progress = driver.run(until_caught_up=True, stop=self.stop_event)
            except BaseException as exc:
                self.error = exc

        self.thread = threading.Thread(target=main, name="broker-faults-driver", daemon=True)
        self.thread.start()

    def _report(self, progress: Progress) -> None:
        self.latest = progress
        for view in progress.partitions:
            self.states[view.status] += 1
            if view.breaker is not None:
                seen = self.breakers.get(view.partition, 0)
                self.breakers[view.partition] = max(seen, view.breaker.total_failures)

    @property
    def alive(self) -> bool:
        return self.thread.is_alive()

    def check(self) -> None:
        if self.error is not None:
            raise AssertionError(f"the run crashed: {describe_error(self.error)}")

    def wait_for(self, predicate: Callable[[], bool], what: str, seconds: float = 60) -> None:
        deadline = time.monotonic() + seconds
        while not predicate():
            self.check()
            assert self.alive, f"the run ended before {what}"
            assert time.monotonic() < deadline, f"waited {seconds:.0f} s for {what}"
            time.sleep(0.05)

    def sleep(self, seconds: float) -> None:
        """Sleep while the fault lasts; the run must not die of it."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.check()
            time.sleep(0.1)

    def finish(self, seconds: float = LIMIT) -> Progress:
        """The run's final progress, once it ended by itself (caught up)."""
        self.thread.join(seconds)
        if self.alive:
            self.stop_event.set()
            self.thread.join(30)
            raise AssertionError(
                f"the run did not catch up within {seconds:.0f} s of the fault's end; "
                f"last progress: {summary(self.latest)}"
            )
        self.check()
        assert self.progress is not None
        return self.progress

    def stop(self) -> None:
        if self.alive:
            self.stop_event.set()
            self.thread.join(60)


def summary(progress: Progress | None) -> str:
    if progress is None:
        return "none"
    names = ("acked", "duplicates", "retried", "released", "dead_lettered", "timed_out")
    counts = {name: progress.total(name) for name in names}
    statuses = {v.partition: (v.status, v.stats.commit_point, v.high) for v in progress.partitions}
    return f"{counts}; batch errors {progress.batch_errors}; partitions {statuses}"


# -- the checks ----------------------------------------------------------------------------------


def applied_count(client: redis.Redis, job: Job) -> int:
    return int(client.hlen(f"{job.config.topic}:applied"))


def runs_count(client: redis.Redis, job: Job) -> int:
    """Healthy messages whose handler started (a batch's effects are applied only when it
    settles: the fault strikes in the middle of a batch when this count says so)."""
    return int(client.get(f"{job.config.topic}:runs") or 0)


def late_in_batch(client: redis.Redis, job: Job) -> Callable[[], bool]:
    """True once the handler is on the last few messages of the second batch: the fault
    strikes sends in flight, and then the third batch's fetches (breakers)."""
    per_batch = job.config.batch_size * len(PARTITIONS) - len(PARTITIONS)  # one poison each
    return lambda: applied_count(client, job) > 0 and runs_count(client, job) >= 2 * per_batch - 4


def refused(client: redis.Redis, job: Job) -> int:
    """Healthy messages whose handler raised: their output send was refused by the fault."""
    raised = hash_counts(client, f"{job.config.topic}:raised")
    return len(raised.keys() - job.poison)


def verify(job: Job, client: redis.Redis, progress: Progress, what: str) -> dict[str, int]:
    """The invariants, against the test's own ledger (see the module docstring)."""
    config, topic = job.config, job.config.topic
    applied = hash_counts(client, f"{topic}:applied")
    raised = hash_counts(client, f"{topic}:raised")
    errors = {k.decode(): v.decode() for k, v in client.hgetall(f"{topic}:errors").items()}
    prefix = f"{topic}/"
    outputs: Counter[str] = Counter()
    for message in read_all(config.brokers, job.output_topic):
        output_id = headers_of(message).get(ID_HEADER, "?")
        source = output_id.removeprefix(prefix).rsplit("#", 1)[0]
        outputs[source] += 1
        assert message.value() == source.encode(), (output_id, message.value())
    letters: Counter[str] = Counter()
    for message in read_all(config.brokers, config.dlq_topic):
        headers = headers_of(message)
        where = (int(headers["kspout.source.partition"]), int(headers["kspout.source.offset"]))
        letters[job.ids.get(where, f"?{where}")] += 1
    healthy, poison = job.healthy, job.poison

    missing = sorted(healthy - applied.keys())
    twice = {i: n for i, n in applied.items() if n != 1}
    applied_poison = sorted(applied.keys() & poison)
    no_output = sorted(healthy - outputs.keys())
    output_twice = {i: n for i, n in outputs.items() if n != 1}
    output_poison = sorted(outputs.keys() & poison)
    undead = sorted(poison - letters.keys())
    letters_twice = {i: n for i, n in letters.items() if n != 1}
    healthy_dead = sorted(letters.keys() - poison)
    paid = {i: n for i, n in raised.items() if i in healthy}
    poison_runs = {i: raised.get(i, 0) for i in sorted(poison)}
    with KafkaMetadata(config) as metadata:
        highs = {p: metadata.watermarks(topic, p)[1] for p in PARTITIONS}
    commits = stored(config)
    print(
        f"\n{what}: {len(job.ids)} messages ({len(poison)} poison); "
        f"applied {len(applied)}, missing {len(missing)}, applied twice {len(twice)}; "
        f"outputs {sum(outputs.values())} for {len(outputs)} ids, more than once "
        f"{output_twice}; dead letters {sum(letters.values())} for {len(letters)} ids, healthy "
        f"among them {len(healthy_dead)}; healthy messages whose handler raised {len(paid)} "
        f"({Counter(errors[i] for i in paid)}); poison runs {set(poison_runs.values())}"
        f"\n  run: {summary(progress)}"
    )
    assert not missing, f"lost: {missing[:10]}"
    assert not twice, f"effects applied more than once: {dict(list(twice.items())[:10])}"
    assert not applied_poison, f"poison messages applied: {applied_poison[:10]}"
    assert not no_output, f"healthy messages without an output record: {no_output[:10]}"
    assert not output_poison, f"outputs of poison messages: {output_poison[:10]}"
    # An output send Kafka did not acknowledge in time is in doubt (it may be in the log): its
    # source message's next attempt sends it again under the same `kspout.id` (output.py).
    # Only such a send may show twice; any other output written twice is a bug.
    repeated = {i: n for i, n in output_twice.items() if n > 1 + paid.get(i, 0)}
    assert not repeated, f"outputs written more than once: {repeated}"
    assert not undead, f"poison messages not dead-lettered: {undead}"
    assert not letters_twice, f"dead-lettered more than once: {letters_twice}"
    assert not healthy_dead, f"healthy messages dead-lettered: {healthy_dead[:10]}"
    # Attempts: each poison message ran exactly its budget (first run plus max_retries), and
    # every retry the run counted is one the handler itself raised for. A fetch, watermark or
    # dead-letter write that failed for the outage spent none.
    assert set(poison_runs.values()) == {MAX_RETRIES + 1}, poison_runs
    assert {errors[i] for i in paid} <= {"OutputUnavailable"}, {i: errors[i] for i in paid}
    assert progress.total("retried") == len(poison) * MAX_RETRIES, summary(progress)
    assert progress.total("released") >= sum(paid.values()), summary(progress)
    assert progress.total("timed_out") == 0, summary(progress)
    assert progress.total("skipped") == 0 and progress.total("lost") == 0, summary(progress)
    assert commits == highs, f"commit points {commits} != high watermarks {highs}"


def leaders(brokers: str, topic: str) -> dict[int, int]:
    """Each partition's leader (broker id, -1 for none), as Kafka's `describe_topics` says."""
    admin = AdminClient({"bootstrap.servers": brokers, "log_level": 0})
    described = admin.describe_topics(TopicCollection([topic]), request_timeout=10)
    description = described[topic].result(timeout=15)
    return {p.id: -1 if p.leader is None else p.leader.id for p in description.partitions}


# -- the tests -----------------------------------------------------------------------------------


@pytest.mark.timeout(300)
def test_a_broker_sigkilled_mid_run_and_started_again_costs_no_message(
    stack: DevStack, own_broker: KafkaBroker, redis_client: redis.Redis
) -> None:
    job = make_job(stack, own_broker.address, "kill")
    produce(job, "kill")
    total = len(job.healthy)
    run = DriverThread(job)
    try:
        run.wait_for(late_in_batch(redis_client, job), "the end of the second batch")
        own_broker.kill()
        killed_at = applied_count(redis_client, job)
        run.sleep(OUTAGE)
        down_for = applied_count(redis_client, job) - killed_at
        assert run.alive, "the run ended while the broker was down"
        own_broker.start()  # same port, same data
        progress = run.finish()
    finally:
        run.stop()
        if not own_broker.running:
            own_broker.start()

    print(
        f"\nkill: SIGKILLed after {killed_at} of {total} applied, {down_for} applied while it "
        f"was down; sends refused {refused(redis_client, job)}; breakers opened (partition: "
        f"infrastructure failures) {run.breakers}; "
        f"statuses seen {dict(run.states)}"
    )
    assert killed_at < total, "the run was over before the broker was killed"
    # The run saw it: a partition's breaker opened, or output sends in flight were refused.
    assert run.breakers or refused(redis_client, job), "the run never saw the broker go"
    verify(job, redis_client, progress, "kill")


@pytest.mark.timeout(300)
def test_a_broker_sigstopped_past_the_request_timeouts_costs_no_message(
    stack: DevStack, own_broker: KafkaBroker, redis_client: redis.Redis
) -> None:
    job = make_job(stack, own_broker.address, "freeze")
    produce(job, "freeze")
    total = len(job.healthy)
    run = DriverThread(job)
    frozen = False
    try:
        run.wait_for(late_in_batch(redis_client, job), "the end of the second batch")
        own_broker.freeze()
        frozen = True
        frozen_at = applied_count(redis_client, job)
        run.sleep(FREEZE)
        during = applied_count(redis_client, job) - frozen_at
        assert run.alive, "the run ended while the broker was frozen"
        own_broker.thaw()
        frozen = False
        progress = run.finish()
    finally:
        if frozen:
            own_broker.thaw()
        run.stop()

    print(
        f"\nfreeze: SIGSTOPped for {FREEZE:.0f} s after {frozen_at} of {total} applied, "
        f"{during} applied while frozen; sends refused {refused(redis_client, job)}; breakers "
        f"opened {run.breakers}; "
        f"statuses seen {dict(run.states)}"
    )
    assert frozen_at < total, "the run was over before the broker was frozen"
    # The run saw it: a partition's breaker opened, or output sends in flight were refused.
    assert run.breakers or refused(redis_client, job), "the run never saw the broker hang"
    verify(job, redis_client, progress, "freeze")


@pytest.mark.timeout(120)
def test_the_start_up_checks_wait_out_a_broker_sigstopped_past_the_request_timeout(
    stack: DevStack, own_broker: KafkaBroker
) -> None:
    """`kspout run`, connected, first asks the broker for the topic, its rights
    (describe_topics) and the dead-letter topic; a broker that hangs meanwhile (in the
    nemesis, a controller election) is asked again once the request times out, and the run
    starts, instead of dying of the timeout."""
    job = make_job(stack, own_broker.address, "checks")
    with KafkaMetadata(job.config) as metadata:
        own_broker.freeze()
        thaw = threading.Timer(FREEZE, own_broker.thaw)
        started = time.monotonic()
        thaw.start()
        try:
            check_cluster(job.config, metadata)  # Read and Write: the broker has no authorizer
        finally:
            thaw.join()
    waited = time.monotonic() - started
    print(f"\nstart-up checks: broker SIGSTOPped for {FREEZE:.0f} s; passed after {waited:.1f} s")
    assert waited >= FREEZE, "the checks never waited on the frozen broker"


@pytest.mark.timeout(300)
def test_the_partition_leader_sigkilled_in_a_replicated_cluster_costs_no_message(
    stack: DevStack, kafka_cluster: KafkaCluster, redis_client: redis.Redis
) -> None:
    job = make_job(stack, kafka_cluster.brokers, "leader", replication=3)
    produce(job, "leader")
    total = len(job.healthy)
    before = leaders(kafka_cluster.brokers, job.config.topic)
    victim, _ = Counter(before.values()).most_common(1)[0]
    led = sorted(p for p, leader in before.items() if leader == victim)
    run = DriverThread(job)
    try:
        run.wait_for(late_in_batch(redis_client, job), "the end of the second batch")
        kafka_cluster.node(victim).kill()  # stays down: two of three replicas remain in sync
        killed_at = applied_count(redis_client, job)
        after = before
        deadline = time.monotonic() + 60
        while any(after[p] in (victim, -1) for p in led):
            run.check()
            assert time.monotonic() < deadline, f"leadership never moved from {victim}: {after}"
            time.sleep(0.5)
            with contextlib.suppress(KafkaException):  # the dead node was the controller
                after = leaders(kafka_cluster.brokers, job.config.topic)
        progress = run.finish()
    finally:
        run.stop()

    print(
        f"\nleader: node {victim} led partitions {led} (leaders {before}); SIGKILLed after "
        f"{killed_at} of {total} applied; leaders then {after}; sends refused "
        f"{refused(redis_client, job)}; breakers opened {run.breakers}; "
        f"statuses seen {dict(run.states)}"
    )
    assert killed_at < total, "the run was over before the leader was killed"
    assert all(after[p] not in (victim, -1) for p in led), after
    verify(job, redis_client, progress, "leader")
