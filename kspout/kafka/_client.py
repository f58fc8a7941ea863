"""Shared plumbing for kspout's Kafka clients: settings, error classes, bounded retries.

Every consumer kspout creates reads by explicit offset (`assign`, never `subscribe`) and never
commits to Kafka: progress lives in ZooKeeper. Out-of-range must surface as an error instead of
librdkafka's silent reset, so the partition's `out_of_range` policy can decide.

Every client sends librdkafka's own log to the `librdkafka` Python logger (`client_settings`)
instead of printing it to stderr: a broker that is down would otherwise fill a terminal with
`%3|...|FAIL|...` lines (the `kspout` command shows them with `-vv` only). The first contact
(`connect`) ends within `CONNECT_TIMEOUT`, sooner when librdkafka finds every broker down, with
an error naming the address and where it was set.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import tenacity
from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    KafkaError,
    KafkaException,
    TopicPartition,
)

from kspout.config import TopicConfig
from kspout.errors import KafkaRefused, KafkaRequestFailed, KafkaTlsRefused, KafkaUnreachable
from kspout.kafka.access import LOGIN_REFUSED, login_refused

T = TypeVar("T")

# librdkafka's own log (confluent-kafka's `logger` setting); served on the thread that polls.
# Silent where logging is not configured (a Spark worker) rather than printed by Python's
# last-resort handler; an application's own handlers still get it.
LIBRDKAFKA_LOG = logging.getLogger("librdkafka")
LIBRDKAFKA_LOG.addHandler(logging.NullHandler())

# Seconds a first contact waits for a broker before the brokers count as unreachable: short
# enough that a command run from cron answers within ~10 s, long enough for a TLS handshake
# with a distant cluster. librdkafka's report that every broker is down (refused, not
# resolved) ends the wait sooner.
CONNECT_TIMEOUT = 8.0
CONNECT_STEP = 0.5  # seconds per metadata request while a first contact waits
# What librdkafka's report of a failed TLS handshake says (a certificate that did not verify,
# a listener that speaks no TLS), whatever code it comes with.
_TLS_REFUSED = "SSL handshake failed"

# Seconds one broker request may take before it counts as a (retriable) timeout.
REQUEST_TIMEOUT = 10.0
# Metadata calls: 5 tries with 0.1 s, 0.2 s, 0.4 s, 0.8 s waits ride out a leader election
# or a broker restart without hiding a dead cluster for long.
RETRY_ATTEMPTS = 5
RETRY_WAIT = tenacity.wait_exponential(multiplier=0.1, max=2.0)

# The Python client builds these errors from a bare code, which drops librdkafka's retriable
# flag, so `KafkaError.retriable()` alone misses them. All are transient by nature.
_TRANSIENT_CODES = frozenset(
    {
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._WAIT_COORD,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.UNKNOWN_LEADER_EPOCH,
    }
)


def client_settings(config: TopicConfig, **extra: Any) -> dict[str, Any]:
    """Settings for any kspout client (consumer, producer, admin): `config.kafka_config`, and
    librdkafka's log sent to `LIBRDKAFKA_LOG` instead of stderr."""
    return config.kafka_config(**extra) | {"logger": LIBRDKAFKA_LOG}


def consumer_settings(config: TopicConfig) -> dict[str, Any]:
    """librdkafka settings for every kspout consumer; kspout's own keys win over `[kafka]`."""
    # kspout reads history, never waits at the end of a partition for new data: a fetch that
    # reaches high should come back at once, not hold the broker connection (and the watermark
    # queries queued behind it) for the default 500 ms. `[kafka]` may still override it.
    defaults: dict[str, Any] = {"fetch.wait.max.ms": 10}
    return defaults | client_settings(
        config,
        **{
            "group.id": f"kspout-{config.spout_id}",  # never joined, never committed to
            "client.id": f"kspout-{config.spout_id}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "error",  # out of range arrives as _AUTO_OFFSET_RESET
            "enable.partition.eof": True,  # reaching high says "nothing more below it"
        },
    )


class BrokerReports:
    """librdkafka's error callback (served by `poll` and `consume`): whether it found every
    broker down, its last other error, which says why (refused, not resolved), and a refused
    login (a wrong SASL user or password, or one changed while the client ran: its next login,
    on a reconnect or a re-authentication, is refused) or a failed TLS handshake (a certificate
    this client's CA did not sign), which no wait cures."""

    def __init__(self) -> None:
        self.all_down = False
        self.last: str | None = None
        self.login_refused: str | None = None
        self.tls_refused: str | None = None

    def __call__(self, error: KafkaError) -> None:
        if error.code() == KafkaError._ALL_BROKERS_DOWN:
            self.all_down = True
        elif error.code() in LOGIN_REFUSED:
            self.login_refused = error.str()
        elif _TLS_REFUSED in error.str():
            self.tls_refused = error.str()
        else:
            self.last = error.str()

    def raise_refused(self, config: TopicConfig) -> None:
        """`KafkaLoginRefused` (`KafkaTlsRefused`) when a broker refused the login (the TLS
        handshake) since the last call; the report is cleared, so a client asked again after
        a fix is judged afresh."""
        login, self.login_refused = self.login_refused, None
        if login is not None:
            raise login_refused(config, login)
        tls, self.tls_refused = self.tls_refused, None
        if tls is not None:
            raise KafkaTlsRefused(config.brokers, config.path, tls)


def connect(
    config: TopicConfig,
    reports: BrokerReports,
    *,
    timeout: float = CONNECT_TIMEOUT,
    clock: Callable[[], float] = time.monotonic,
) -> Consumer:
    """A consumer (`consumer_settings`) that has had an answer from a broker: it asked for the
    topic's metadata. `KafkaUnreachable`, naming the address and where it was set, when no
    broker answers within `timeout`, or once librdkafka finds every broker down;
    `KafkaLoginRefused` at once when a broker refuses the SASL login, `KafkaTlsRefused` when
    the TLS handshake fails. `reports` stays the consumer's error callback: ask it later
    (`raise_refused`) for a login refused since."""
    consumer = Consumer(consumer_settings(config) | {"error_cb": reports})
    deadline = clock() + timeout
    while True:
        try:
            consumer.list_topics(config.topic, timeout=CONNECT_STEP)
            return consumer
        except KafkaException as exc:
            if not is_transient(exc.args[0]):
                consumer.close()
                hint = "check the brokers and the [kafka] security settings"
                raise KafkaRequestFailed(
                    "metadata request", config.topic, None, str(exc.args[0]), hint
                ) from exc
        consumer.poll(0)  # serves the error callback
        try:
            reports.raise_refused(config)
        except KafkaRefused:
            consumer.close()
            raise
        if reports.all_down or clock() >= deadline:
            consumer.close()
            cause = reports.last or f"no broker answered within {timeout:g}s"
            raise KafkaUnreachable(config.brokers, config.origin("brokers"), cause)


def is_transient(error: KafkaError) -> bool:
    """True when asking again may succeed; a fatal error never is."""
    if error.fatal():
        return False
    return error.retriable() or error.code() in _TRANSIENT_CODES


def _transient_exception(exc: BaseException) -> bool:
    return isinstance(exc, KafkaException) and is_transient(exc.args[0])


def call_kafka(
    operation: str,
    topic: str,
    partition: int | None,
    call: Callable[[], T],
    *,
    sleep: Callable[[float], None] = tenacity.nap.sleep,
    attempts: int = RETRY_ATTEMPTS,
) -> T:
    """Run one broker request, retrying transient errors; raise KafkaRequestFailed otherwise."""
    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception(_transient_exception),
        stop=tenacity.stop_after_attempt(attempts),
        wait=RETRY_WAIT,
        sleep=sleep,
        reraise=True,
    )
    try:
        return retrying(call)
    except KafkaException as exc:
        error: KafkaError = exc.args[0]
        if error.code() in (KafkaError._UNKNOWN_PARTITION, KafkaError.UNKNOWN_TOPIC_OR_PART):
            hint = "check that the topic and partition exist"
        elif is_transient(error):
            hint = f"gave up after {attempts} tries; check that the brokers are reachable"
        else:
            hint = "check the brokers, the topic and the [kafka] security settings"
        raise KafkaRequestFailed(
            operation, topic, partition, str(error), hint, transient=is_transient(error)
        ) from exc


def watermarks(
    consumer: Consumer,
    topic: str,
    partition: int,
    *,
    timeout: float = REQUEST_TIMEOUT,
    attempts: int = RETRY_ATTEMPTS,
) -> tuple[int, int]:
    """Fresh `(low, high)` from the partition leader (`attempts` tries of `timeout` seconds).

    `high` is what this consumer can read up to: under the default `read_committed` isolation
    it is the last stable offset, so an open transaction's records are never reported missing.

    librdkafka answers "unknown partition" both for a partition the topic lacks and for one
    that has no leader (Kafka 4.2, its only replica's node down: the metadata lists it with
    LEADER_NOT_AVAILABLE, and the client's own view may lag a leader that just came back). The
    metadata tells them apart, so a partition that exists is retried as the transient fault it
    is, not reported missing.
    """

    def query() -> tuple[int, int]:
        try:
            result = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=timeout, cached=False
            )
        except KafkaException as exc:
            if exc.args[0].code() == KafkaError._UNKNOWN_PARTITION:
                _raise_if_listed(consumer, topic, partition, timeout)
            raise
        if result is None:  # the client's way of saying the request timed out
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT))
        low, high = result
        return low, high

    return call_kafka("watermark query", topic, partition, query, attempts=attempts)


def _raise_if_listed(consumer: Consumer, topic: str, partition: int, timeout: float) -> None:
    """Raise LEADER_NOT_AVAILABLE (transient) when the metadata lists `partition` of `topic`:
    librdkafka's "unknown partition" then came from a partition without a leader (or a view
    of it from before its leader came back). Return when the metadata does not list it, or
    cannot be asked."""
    try:
        found = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
    except KafkaException:
        return
    if found is not None and partition in found.partitions:
        leader = found.partitions[partition].leader
        raise KafkaException(
            KafkaError(
                KafkaError.LEADER_NOT_AVAILABLE,
                f"partition {partition} exists but had no leader (now: {leader})",
            )
        )


def all_watermarks(
    consumer: Consumer,
    topic: str,
    partitions: Iterable[int],
    *,
    timeout: float = REQUEST_TIMEOUT,
    attempts: int = RETRY_ATTEMPTS,
    lows: Mapping[int, int] | None = None,
    epochs: dict[int, int] | None = None,
) -> dict[int, tuple[int, int]]:
    """Fresh `(low, high)` of every partition in `partitions`, in one batched query.

    `lows` gives the low marks the caller knows recently enough: those partitions are asked
    their high only, and when every one is given the query is one request per broker.
    `epochs`, when given, is filled with the leader epoch each leader sent with its high (the
    epoch to validate that position in, KIP-320; left out where the broker sent none).

    `offsets_for_times` with ListOffsets' special timestamps asks each partition leader once
    for the earliest offsets of all the partitions it leads, then once for the latest: two
    requests per broker, where `watermarks` costs a round trip per partition. `high` follows
    the consumer's isolation level as in `watermarks` (librdkafka sends it with both). Any
    partition without an answer fails the query (`KafkaRequestFailed`, naming it).

    Not `AdminClient.list_offsets`, which asks the same ListOffsets requests. Measured on
    Apache Kafka 4.2 (a 3-node KRaft cluster on loopback, librdkafka 2.16.0, 40 partitions led
    by two brokers, both ends asked, 400 interleaved calls each on a loaded 2-core host):

    * cost per call: this query 3.7 ms median and 0.76 ms of client CPU, `list_offsets` 4.7 ms
      and 2.4 ms of CPU (one partition: 1.2 ms / 0.30 ms against 1.6 ms / 0.53 ms);
    * a leader down (its node killed, replication 1): `list_offsets` answers its partitions
      with offset -1001 and no error, after its whole request timeout, both while the metadata
      still names the dead leader and once the controller has set it to none. This query
      times out whole while the dead leader is named (`watermarks_now` then asks each leader's
      partitions apart) and fails those partitions with LEADER_NOT_AVAILABLE at once after;
    * the node back: the same AdminClient went on answering FENCED_LEADER_EPOCH for the
      partitions it leads again for over 60 s, where this query's answers were right.

    It would also need a client of its own beside the consumer.
    """
    asked = sorted(set(partitions))
    if not asked:
        return {}

    known = {} if lows is None else lows
    missing = [p for p in asked if p not in known]

    def query() -> dict[int, tuple[int, int]]:
        found = _offsets_at(consumer, topic, missing, OFFSET_BEGINNING, timeout) if missing else {}
        highs = _offsets_at(consumer, topic, asked, OFFSET_END, timeout, epochs)
        return {p: (found[p] if p in found else known[p], highs[p]) for p in asked}

    where = asked[0] if len(asked) == 1 else None
    return call_kafka("watermark query", topic, where, query, attempts=attempts)


@functools.lru_cache(maxsize=8)
def _requests(topic: str, partitions: tuple[int, ...], which: int) -> list[TopicPartition]:
    """The request list for `_offsets_at`, made once per set of partitions: a driver asks the
    same thousand every step, and building them costs half a millisecond. Read-only: shared
    by every call that asks the same."""
    return [TopicPartition(topic, p, which) for p in partitions]


def _offsets_at(
    consumer: Consumer,
    topic: str,
    partitions: list[int],
    which: int,
    timeout: float,
    epochs: dict[int, int] | None = None,
) -> dict[int, int]:
    """One end (`OFFSET_BEGINNING` or `OFFSET_END`) of each partition, in one call; a
    partition's own error fails the call, with its partition named and its code kept (so a
    transient one is retried). `epochs`: filled with the leader epochs that came with them."""
    asked = _requests(topic, tuple(partitions), which)
    answers = consumer.offsets_for_times(asked, timeout=timeout)
    for answer in answers:
        error = answer.error
        if error is not None:
            raise KafkaException(
                KafkaError(
                    error.code(),
                    f"partition {answer.partition}: {error.str()}",
                    fatal=error.fatal(),
                    retriable=error.retriable(),
                )
            )
    if epochs is not None:
        for answer in answers:
            epoch = answer.leader_epoch
            if epoch is not None and epoch >= 0:
                epochs[answer.partition] = epoch
    return {answer.partition: answer.offset for answer in answers}
