"""Kafka output for handlers and bolts: what one topology publishes for the next to consume.

`KafkaOutput(config, topic).send(record, value, key=..., index=...)` produces through an
idempotent, acks=all producer (one per Python worker, made there: producers do not pickle) and
stamps each message with a `kspout.id` header derived from its source message, the same on
every replay of that message:

    <topic>@<partition>:<offset>#<index>    from the source record's place in Kafka
    <topic>/<source_id>#<index>             with `source_id`, the source message's own id

`index` tells apart the outputs of one source message (0, 1, ...). Topic names cannot hold
`@`, `/` or `#`, so the two forms never meet. Stage two reads the id with
`[dedup] id_source = "header:kspout.id"`, and the dedup bolt applies each output once however
often stage one re-published it (a retry after the send, a timeout replay while the original
still ran).

A source message may be acked only once Kafka acknowledged its outputs: acked first, an output
still queued in a worker that then dies would be lost for good, and the replay that would have
re-published it never comes. So:

* a handler `f(record)`, or a dedup-bolt handler, calls `output.flush()` before it returns:
  a plain handler's acks reach the driver while its task still runs, and the dedup bolt marks
  a message DONE right after its handler returns (a DONE message's replay never runs it);
* `Publish(function, output)` is the bolt for chains: it runs `function(record, output)` on
  each input and flushes once per task, then acks each input whose outputs Kafka acknowledged
  and fails the others (a chain's acks leave a task only once the bolt returned).

A send Kafka did not acknowledge never acks its source message. Whose fault it is decides the
rest: a send that failed for a reason the output's Kafka may get over by itself (unreachable,
timed out, no leader, not enough in-sync replicas: librdkafka's retriable errors) is the
infrastructure's, so the message is released, no attempt spent, and its partition backs off
behind its breaker until Kafka takes sends again (`OutputUnavailable`). A send the cluster
refused this principal (no Write ACL on the output topic, a refused login: `KafkaAccessDenied`,
`KafkaLoginRefused`) is not the message's fault either, and no retry cures it: the message is
released and the run stops, naming the ACL to grant. Any other refusal (too large, a bad
record) fails it with EXCEPTION, retried with backoff, then dead-lettered (`OutputFailed`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import KafkaError, Message

from kspout.bolts import Bolt, Collector, Tuple
from kspout.channel.beacon import thread_beacon
from kspout.config import TopicConfig
from kspout.errors import KafkaRefused, OutputFailed, OutputUnavailable
from kspout.kafka import Record
from kspout.kafka.access import LOGIN_REFUSED, NOT_AUTHORIZED, refusal
from kspout.kafka.deadletter import FLUSH_MARGIN, HEADER_PREFIX, IdempotentProducer
from kspout.outcomes import describe_error
from kspout.worker_clients import WorkerClients

ID_HEADER = HEADER_PREFIX + "id"
NO_REPORT = "no delivery report before the timeout"
# Delivery errors of an unreachable or unsettled cluster, beside those librdkafka calls
# retriable: a send that ran out of time says nothing against its message.
_OUTAGES = frozenset(
    {
        KafkaError._MSG_TIMED_OUT,
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
    }
)

OutputHeaders = Sequence[tuple[str, str | bytes | None]]


def output_id(source: Record, index: int = 0, source_id: str | None = None) -> str:
    """The id of the `index`-th output of `source`: `<topic>@<partition>:<offset>#<index>`, or
    `<topic>/<source_id>#<index>` when the source message has an id of its own."""
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError(f"index must be an int >= 0, not {index!r}")
    if source_id is None:
        return f"{source.topic}@{source.partition}:{source.offset}#{index}"
    if not source_id:
        raise ValueError("source_id is empty: pass the source message's id, or None")
    return f"{source.topic}/{source_id}#{index}"


def raise_unacknowledged(config: TopicConfig, topic: str, deliveries: Sequence[_Delivery]) -> None:
    """Raise `KafkaRefused`, `OutputUnavailable` or `OutputFailed` for the sends Kafka did not
    acknowledge (nothing if it acknowledged them all)."""
    failed = [(d.id, d.error) for d in deliveries if d.error is not None]
    if not failed:
        return
    for delivery in deliveries:
        if delivery.refused is not None:
            found = refusal(config, delivery.refused, "Write", topic)
            assert found is not None, "`refused` holds only refusals"
            raise found
    if all(d.outage for d in deliveries if d.error is not None):
        raise OutputUnavailable(topic, failed)
    raise OutputFailed(topic, failed)


class _Delivery:
    """One send's answer from Kafka: `error` is None once acknowledged; `outage` says whether
    the failure was the cluster's (no report at all counts as one); `refused` holds Kafka's
    error when it refused the principal (a missing ACL, a refused login)."""

    __slots__ = ("error", "id", "outage", "refused")

    def __init__(self, id_: str) -> None:
        self.id = id_
        self.error: str | None = NO_REPORT
        self.outage = True
        self.refused: KafkaError | None = None

    def report(self, error: KafkaError | None, _message: Message) -> None:
        if error is None:
            self.error = None
            return
        self.error = str(error)
        self.outage = error.retriable() or error.code() in _OUTAGES
        if error.code() in NOT_AUTHORIZED | LOGIN_REFUSED:
            self.refused = error


class _OutputProducer(IdempotentProducer):
    """The idempotent producer a Python worker shares between its outputs."""

    def send(self, topic: str, delivery: _Delivery, **message: Any) -> None:
        """Queue one message, its answer to go to `delivery` (`produce` says what it raises)."""
        self.produce(topic, on_delivery=delivery.report, **message)

    def wait(self) -> None:
        """Until every queued message has its delivery report (or librdkafka's own timeout,
        `fetch_timeout`, plus a margin passed)."""
        assert self._producer is not None, "started by _started"
        self._producer.flush(self._config.fetch_timeout + FLUSH_MARGIN)


def _started(config: TopicConfig) -> _OutputProducer:
    producer = _OutputProducer(config, "output")
    producer.start()
    return producer


_producers = WorkerClients(_started)


class KafkaOutput:
    """Sends to `topic`, each message stamped with its `kspout.id` (see the module docstring).

    `config_or_brokers` is a topic config (its brokers, `[kafka]` security settings, and
    `fetch_timeout` as librdkafka's delivery timeout), such as the source topic's, or a
    bootstrap address. Built on the driver and shipped with the handler or bolt; the producer
    is made in each Python worker on first send.
    """

    def __init__(self, config_or_brokers: TopicConfig | str, topic: str) -> None:
        if isinstance(config_or_brokers, str):
            config_or_brokers = TopicConfig(topic=topic, spout_id=topic, brokers=config_or_brokers)
        self.config = config_or_brokers
        self.topic = topic
        self._log: list[_Delivery] = []  # the sends `flush` has yet to check
        self._queued = False  # sent since the last wait
        self._producer: _OutputProducer | None = None  # this worker's, found on first send

    def send(
        self,
        record: Record,
        value: str | bytes | None,
        key: str | bytes | None = None,
        headers: OutputHeaders | None = None,
        index: int = 0,
        source_id: str | None = None,
    ) -> str:
        """Queue the `index`-th output of `record` (see `output_id`); returns its id.

        Asynchronous: the message is durable only once `flush()` returned (or, in `Publish`,
        once the bolt acked its input). `KafkaAccessDenied` at once when the producer already
        knows this principal may not write the topic.
        """
        id_ = output_id(record, index, source_id)
        stamped: list[tuple[str, str | bytes | None]] = list(headers or ())
        if any(name == ID_HEADER for name, _ in stamped):
            raise ValueError(f"the {ID_HEADER} header is the output's own; pass no such header")
        stamped.append((ID_HEADER, id_.encode()))
        delivery = _Delivery(id_)
        self._producer_of().send(self.topic, delivery, key=key, value=value, headers=stamped)
        self._log.append(delivery)
        self._queued = True
        return id_

    def flush(self) -> None:
        """Wait until Kafka answered every send since the last flush; raise `OutputFailed`
        (`OutputUnavailable` for an outage) naming those it did not acknowledge, or
        `KafkaAccessDenied` when Kafka refused this principal Write on the topic."""
        self._wait()
        sent = list(self._log)
        self._log.clear()  # in place: `Publish` holds this list while an input runs
        raise_unacknowledged(self.config, self.topic, sent)

    def _wait(self) -> None:
        """Until every send so far has Kafka's answer (in its `_Delivery`)."""
        if self._queued:
            self._producer_of().wait()
            self._queued = False

    def _producer_of(self) -> _OutputProducer:
        """This worker's producer for the config (looked up once per output, not per send)."""
        if self._producer is None:
            self._producer = _producers.get(self.config)
        return self._producer

    def _track(self) -> list[_Delivery]:
        """A new list that the sends from now on go to (`Publish` keeps one per input)."""
        self._log = []
        return self._log

    def __getstate__(self) -> dict[str, object]:
        """Only the settings travel: sends belong to the worker that made them."""
        return {"config": self.config, "topic": self.topic}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._log = []
        self._queued = False
        self._producer = None

    def __repr__(self) -> str:
        return f"KafkaOutput({self.config.brokers!r}, {self.topic!r})"


PublishFunction = Callable[[Record, KafkaOutput], object]


class Publish(Bolt):
    """Runs `function(record, output)` on each input and acks it once Kafka acknowledged every
    output it sent: one flush per task, however many inputs.

    An input whose function raised fails with its error (what it sent before raising is
    still flushed); one with a send Kafka did not acknowledge fails naming it, or is released
    (no attempt spent) when the output's Kafka was down; a send refused for this principal's
    rights fails the task (`KafkaRefused`), which stops the run. The bolt emits
    nothing, so it ends its chain. Further down a chain, the input tuple must carry the
    source record in a `record` field (the id is derived from it).
    """

    terminal = True

    def __init__(self, function: PublishFunction, output: KafkaOutput) -> None:
        self.function = function
        self.output = output

    def execute(self, tuple_: Tuple, collector: Collector) -> None:
        self.execute_batch([tuple_], collector)

    def execute_batch(self, tuples: Sequence[Tuple], collector: Collector) -> None:
        """Run the function on every input, flush once, then ack or fail each input."""
        output = self.output
        beacon = thread_beacon()
        ran: list[tuple[Tuple, list[_Delivery]]] = []
        for tuple_ in tuples:
            beacon.current = tuple_
            sent = output._track()
            try:
                self.function(tuple_.record, output)
            except KafkaRefused:
                raise  # a right the principal lost: the task is released, the run stops
            except Exception as exc:
                collector.fail(tuple_, exc)
            else:
                ran.append((tuple_, sent))
        beacon.current = None  # the flush below is Kafka's time, not the last input's
        output._wait()
        output._track()
        for tuple_, sent in ran:
            try:
                raise_unacknowledged(output.config, output.topic, sent)
            except OutputUnavailable as exc:
                collector.release(tuple_, describe_error(exc))
            except OutputFailed as exc:
                collector.fail(tuple_, exc)
            else:
                collector.ack(tuple_)

    def __repr__(self) -> str:
        name = getattr(self.function, "__qualname__", self.function)
        return f"Publish({name!r}, {self.output!r})"
