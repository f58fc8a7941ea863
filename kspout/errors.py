"""Every error kspout raises, under one root, each carrying what the caller needs next.

Classes are sorted by the caller's next move, one group class each:

* `FixSetup` — the config, the command or stored data must change first: the same call again
  fails the same (a missing topic, a wrong password, another topic's offsets, a running spout);
* `RetryLater` — a server did not answer, after kspout's own retries: nothing was lost, try
  again later (Kafka, ZooKeeper, Redis, owners slow to ack a pause);
* `GiveUp` — stop this work: another writer owns what this one would write (never retry: it
  would overwrite theirs), Kafka no longer holds the offsets (the `out_of_range` policy resets
  or stops the partition), or Kafka refused a message's outputs (the message fails).

`OutputUnavailable` is an `OutputFailed` for those who catch that, and a `KafkaUnavailable`:
the outage wins, the message is released and retried later. The streaming source's own errors
are in `kspout.streaming.errors`, dedup's in `dedup.errors`; exceptions a module raises and
catches itself (a cancelled batch, a failed stage) are private signals, not errors for callers.
"""

from __future__ import annotations

import shlex

from kspout.wording import count


def resume_command(config_path: str, partition: int) -> str:
    """The `kspout offsets set` command that resumes a stopped partition from Kafka's earliest."""
    return (
        f"kspout offsets set --config {shlex.quote(config_path)} --partition {partition} "
        "--to earliest"
    )


class KspoutError(Exception):
    """Root of every error raised by kspout."""

    def __reduce__(self) -> tuple[object, ...]:
        """Pickle without calling `__init__` (its arguments are not `args`): a refusal found
        on a Spark worker travels to the driver in its task's result."""
        return _rebuilt, (type(self), self.args, self.__dict__)


def _rebuilt(cls: type[KspoutError], args: tuple[object, ...], state: dict[str, object]) -> object:
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


class FixSetup(KspoutError):
    """The config, the command or stored data must change before trying again."""


class RetryLater(KspoutError):
    """A server did not answer (after kspout's own retries); nothing was lost: try later."""


class GiveUp(KspoutError):
    """Stop this work: it belongs to another writer now, or its offsets or outputs are gone."""


# Fix the setup: the config, the command or stored data must change first.


class ConfigError(FixSetup):
    """A topic config file is missing, malformed, or holds a value that is not allowed."""

    def __init__(self, path: str, key: str | None, message: str) -> None:
        self.path = path
        self.key = key
        self.message = message
        where = f"{path}: {key}" if key else path
        super().__init__(f"{where}: {message}")


class ChainError(FixSetup, ValueError):
    """A bolt chain passed to `KafkaSpout.run` cannot be built (order, fields, item types)."""


class TopicMismatch(FixSetup):
    """The stored offset record belongs to another topic (two spouts share one spout id)."""

    def __init__(self, path: str, stored_topic: str, topic: str) -> None:
        self.path = path
        self.stored_topic = stored_topic
        self.topic = topic
        super().__init__(
            f"{path} holds offsets for topic {stored_topic!r}, not {topic!r}: two spouts share "
            "this spout_id; give each topic its own spout_id (or zk_root)"
        )


class RedisLoginRefused(FixSetup):
    """The dedup bolt's Redis refused its login at start: a wrong or missing user or password
    (fix the config, retrying will not help)."""

    def __init__(self, url: str, user: str, cause: str) -> None:
        self.url = url
        self.user = user
        self.cause = cause
        super().__init__(
            f"Redis at {url} refused the login of user {user!r} ({cause}): check "
            "`redis.username` and the password (`redis.password`, `password_file` or "
            "`password_env`), and that the ACL user exists and is enabled"
        )


class RedisTlsRefused(FixSetup):
    """The TLS handshake with the dedup bolt's Redis failed at start: an unknown server
    certificate, or a server that wants a client certificate (fix the config)."""

    def __init__(self, url: str, cause: str) -> None:
        self.url = url
        self.cause = cause
        super().__init__(
            f"TLS with Redis at {url} failed ({cause}): check `redis.ssl_ca_certs` (the CA "
            "that signed the server's certificate) and `redis.ssl_certfile`/`ssl_keyfile` "
            "(a client certificate, when the server asks for one)"
        )


class StackError(FixSetup):
    """The embedded development stack could not start, or a part of it is missing."""


class OffsetRecordInvalid(FixSetup):
    """A stored offset record is not storm-kafka's JSON (or has no integer `offset`)."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(
            f"{path} is not a valid offset record: {reason}; fix it, or overwrite it with "
            "`kspout offsets set --config <file> --partition <n> --to <offset> --force`"
        )


class ZooKeeperAccessDenied(FixSetup):
    """ZooKeeper refused an operation because the node's ACL needs other credentials."""

    def __init__(self, path: str, hosts: str) -> None:
        self.path = path
        self.hosts = hosts
        super().__init__(
            f"ZooKeeper at {hosts} refused access to {path} (NoAuth): its ACL requires "
            "credentials; set [zookeeper_auth] credential to the user:password that created it"
        )


class InstanceIdInUse(FixSetup):
    """Another live ZooKeeper session already registered this spout instance id."""

    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(
            f"{path} is held by another live session: two running spouts were given the same "
            "instance id; give each run its own (or let kspout generate one)"
        )


class SpoutRunning(FixSetup):
    """An operator command that moves offsets found them owned by live spout instances."""

    def __init__(self, spout_path: str, instances: list[str], partitions: list[int]) -> None:
        self.spout_path = spout_path
        self.instances = instances
        self.partitions = partitions
        super().__init__(
            f"spout {spout_path} is running: partitions {', '.join(map(str, partitions))} are "
            f"owned by live instances ({', '.join(instances)}); pass --force to pause them, "
            "move them and resume them (their owners finish what runs there first), or stop "
            "the spout first"
        )


class ReplayPastWindow(FixSetup):
    """A start or an operator's move would process again messages that may have been finished
    longer ago than the chain's replay window (the dedup bolt's `[dedup] ttl`): their DONE
    records may be gone, so their effects would apply twice."""

    def __init__(self, topic: str, window: float, details: list[str], override: str) -> None:
        self.topic = topic
        self.window = window
        self.details = details  # one line per partition: which offsets, finished when
        super().__init__(
            f"{topic}: this would process again offsets that may have been finished more than "
            f"the dedup window ({window:g}s) ago, whose effects would then apply again:\n  "
            + "\n  ".join(details)
            + f"\nCheck the partitions above; to go ahead anyway, {override}"
        )


class ProduceFailed(FixSetup):
    """Kafka refused, or did not acknowledge, messages written to a topic (`kspout produce`)."""

    def __init__(self, topic: str, written: int, failed: int, error: str) -> None:
        self.topic = topic
        self.written = written
        self.failed = failed
        self.error = error
        kept = f"the {written} acknowledged stay in the topic" if written else "none was written"
        super().__init__(
            f"{topic}: {failed} message(s) not written ({error}); {kept}. Check the brokers, "
            "that this client may write to the topic, and the message size (the topic's "
            "max.message.bytes)"
        )


class TopicNotFound(FixSetup):
    """The topic does not exist on the brokers the config names (every command refuses it)."""

    def __init__(self, topic: str, brokers: str, path: str, brokers_origin: str) -> None:
        self.topic = topic
        self.brokers = brokers
        super().__init__(
            f"topic {topic!r} does not exist on {brokers}: check `topic` in {path}, and "
            f"{brokers_origin}, or create the topic first"
        )


class LetterNotFound(FixSetup):
    """An operator named a dead letter (`--offset P:O`) that the dead-letter topic lacks."""

    def __init__(self, dlq_topic: str, partition: int, offset: int, why: str) -> None:
        self.dlq_topic = dlq_topic
        self.partition = partition
        self.offset = offset
        super().__init__(
            f"{dlq_topic}: no dead letter at {partition}:{offset} ({why}); list the letters "
            "with `kspout dlq show --config <topic file>` and name them as DLQ_PARTITION:OFFSET"
        )


class NoLiveInstance(FixSetup):
    """A rebalance found no live instance of the spout: nothing owns partitions to move."""

    def __init__(self, spout_path: str) -> None:
        self.spout_path = spout_path
        super().__init__(
            f"no live instance of spout {spout_path}: nothing owns partitions to move; "
            "start one with `kspout run`"
        )


class KafkaRefused(FixSetup):
    """Kafka refused this client's principal: its login, an operation its ACLs do not allow, a
    TLS handshake, or a dead-letter topic it will not create. Asking again never helps, so a
    run stops with it, even mid-run (a revoked ACL, a changed password, a deleted topic)."""


class DeadLetterTopicMissing(KafkaRefused):
    """The dead-letter topic does not exist, and Kafka refused to create it (no Create right
    for the principal, a topic policy), or it was deleted while a run wrote to it."""

    def __init__(self, topic: str, principal: str, brokers: str, path: str, why: str) -> None:
        self.topic = topic
        self.principal = principal
        self.why = why
        create = f"kafka-topics.sh --bootstrap-server {brokers} --create --topic {topic}"
        grant = (
            f"kafka-acls.sh --bootstrap-server {brokers} --add --allow-principal {principal} "
            f"--operation Create --topic {topic}"
        )
        super().__init__(
            f"the dead-letter topic {topic!r} does not exist and Kafka did not create it ({why}): "
            f"create it (`{create}`), or grant {principal} Create on it (`{grant}`); or name "
            f"another in `dead_letter_topic` in {path}"
        )


class KafkaTlsRefused(KafkaRefused):
    """The TLS handshake with Kafka failed: the brokers' certificate is not signed by the CA
    this client trusts (or names another host)."""

    def __init__(self, brokers: str, path: str, cause: str) -> None:
        self.brokers = brokers
        self.cause = cause
        super().__init__(
            f"TLS with Kafka at {brokers} failed ({cause}): check `kafka.ssl.ca.location` in "
            f"{path} (the CA that signed the brokers' certificates) and that the certificates "
            "name the host in `brokers`"
        )


class KafkaLoginRefused(KafkaRefused):
    """Kafka refused this client's SASL login: a wrong user or password, or a mechanism the
    broker does not offer."""

    def __init__(self, principal: str, brokers: str, path: str, cause: str) -> None:
        self.principal = principal
        self.brokers = brokers
        self.cause = cause
        super().__init__(
            f"Kafka at {brokers} refused the login of {principal} ({cause}): check "
            f"`kafka.sasl.username` and the password (`kafka.sasl.password`, `sasl.password_file` "
            f"or `sasl.password_env`) and `kafka.sasl.mechanism` in {path}, and that the user "
            "exists on the cluster with that mechanism"
        )


class KafkaAccessDenied(KafkaRefused):
    """Kafka's authorizer refused this client's principal an operation on a topic: an ACL is
    missing (grant it, or log in as a principal that has it)."""

    def __init__(
        self, principal: str, operation: str, topic: str, brokers: str, path: str, why: str
    ) -> None:
        self.principal = principal
        self.operation = operation
        self.topic = topic
        self.why = why
        grant = (
            f"kafka-acls.sh --bootstrap-server {brokers} --add --allow-principal {principal} "
            f"--operation {operation} --topic {topic}"
        )
        super().__init__(
            f"Kafka refused {principal} {operation} on topic {topic!r} ({why}): grant it "
            f"(`{grant}`), or log in as a principal that has it (`kafka.sasl.username` in {path})"
        )


# Retry later: a server did not answer; nothing was lost.


class ZooKeeperUnavailable(RetryLater):
    """ZooKeeper did not answer after the configured retries."""


class KafkaUnavailable(RetryLater):
    """Kafka did not answer (metadata, watermarks, fetch) after the configured retries."""


class RedisUnavailable(RetryLater):
    """The dedup bolt's Redis did not answer at start (down, unreachable, or a wrong address)."""

    def __init__(self, url: str, url_origin: str, cause: str) -> None:
        self.url = url
        self.cause = cause
        super().__init__(
            f"cannot reach Redis at {url} ({cause}); the address is {url_origin}: check that "
            "the server runs and this host can reach it, or correct the address"
        )


class KafkaRequestFailed(KafkaUnavailable):
    """A metadata, watermark or timestamp request failed for good (fatal, or retries spent)."""

    def __init__(
        self,
        operation: str,
        topic: str,
        partition: int | None,
        error: str,
        hint: str,
        *,
        transient: bool = False,
    ) -> None:
        self.operation = operation
        self.topic = topic
        self.partition = partition
        self.error = error
        self.transient = transient  # the cluster answered, but could not serve yet: ask later
        where = topic if partition is None else f"{topic}[{partition}]"
        super().__init__(f"{where}: {operation} failed: {error}. {hint}")


class FetchTimeout(KafkaUnavailable):
    """A fetch waited `fetch_timeout` seconds for an offset Kafka should have, and gave up."""

    def __init__(self, topic: str, partition: int, offset: int, timeout: float) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.timeout = timeout
        super().__init__(
            f"{topic}[{partition}]: offset {offset} did not arrive within fetch_timeout = "
            f"{timeout:g}s; check that the partition has a live leader and the brokers are "
            "reachable, or raise fetch_timeout for a slow cluster"
        )


class DeadLetterWriteFailed(KafkaUnavailable):
    """Some dead letters were not acknowledged by Kafka; none may be counted as written."""

    def __init__(self, dlq_topic: str, failures: list[tuple[str, int, int, str]]) -> None:
        self.dlq_topic = dlq_topic
        self.failures = failures  # (source topic, partition, offset, error) per lost letter
        first = failures[0]
        super().__init__(
            f"{len(failures)} dead letter(s) for {dlq_topic} were not written (first: "
            f"{first[0]}[{first[1]}]@{first[2]}: {first[3]}); they stay unfinished and are "
            "written again later; check that the topic exists and this client may write to it"
        )


class KafkaUnreachable(KafkaUnavailable):
    """No broker answered a first request: none runs at the address, it is wrong, or the
    network or the `[kafka]` security settings keep this client out."""

    def __init__(self, brokers: str, brokers_origin: str, cause: str) -> None:
        self.brokers = brokers
        self.cause = cause
        super().__init__(
            f"cannot reach Kafka at {brokers} ({cause}); the address is "
            f"{brokers_origin}: check that the brokers run and this host can reach them (and the "
            "[kafka] security settings, with TLS or SASL), or correct the address"
        )


class PauseNotAcked(RetryLater):
    """Owners did not ack a pause in time (a batch still running there, or a stuck owner)."""

    def __init__(self, waiting: dict[int, str], timeout: float) -> None:
        self.waiting = waiting
        shown = ", ".join(f"{p} (owner {owner})" for p, owner in sorted(waiting.items()))
        super().__init__(
            f"no ack within {timeout:g}s for the pause of partitions {shown}: their owners "
            "still run batches there, or are stuck; look at `kspout status`, and try again"
        )


class RebalanceNotDone(RetryLater):
    """A rebalance lost a race (the assignment changed while it computed the moves) or the new
    owners did not claim their partitions in time: run it again, or look at `kspout status`."""


# Give up: the work belongs to another writer, or its offsets or outputs are gone.


class OffsetOutOfRange(GiveUp):
    """The offset a partition needs is outside Kafka's `[low, high)` for that partition."""

    def __init__(
        self, topic: str, partition: int, offset: int, low: int, high: int, hint: str = ""
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.low = low
        self.high = high
        msg = f"{topic}[{partition}]: offset {offset} is out of range; Kafka holds [{low}, {high})"
        super().__init__(f"{msg}. {hint}" if hint else msg)


class PartitionStopped(OffsetOutOfRange):
    """The `out_of_range = "fail"` policy stopped a partition until an operator moves it."""

    def __init__(self, topic: str, partition: int, offset: int, low: int, high: int) -> None:
        super().__init__(
            topic,
            partition,
            offset,
            low,
            high,
            hint=(
                'out_of_range = "fail" stops the partition here; move it with '
                f"`kspout offsets set --config <file> --partition {partition} --to earliest` "
                "(or latest, a number, timestamp:<ms>); a running spout resumes it from there"
            ),
        )


class OffsetConflict(GiveUp):
    """A compare-and-set commit lost: someone else wrote the record since we read it."""

    def __init__(self, path: str, expected_version: int) -> None:
        self.path = path
        self.expected_version = expected_version
        super().__init__(
            f"{path} changed since version {expected_version}: another spout instance or an "
            "operator moved it; this instance no longer owns the partition and stops committing"
        )


class OwnershipLost(OffsetConflict):
    """A fenced commit found this instance's claim on the partition gone: its ZooKeeper
    session expired (a stopped process that woke up) and the partition may have a new owner."""

    def __init__(self, path: str, claim: str) -> None:
        KspoutError.__init__(
            self,
            f"commit to {path} refused: the claim {claim} is gone (this instance's ZooKeeper "
            "session expired); another instance owns the partition now or will claim it",
        )
        self.path = path
        self.claim = claim
        self.expected_version = -1


class OffsetRecordExists(OffsetConflict):
    """Creating a first offset record lost: another writer created it since we looked."""

    def __init__(self, path: str) -> None:
        KspoutError.__init__(
            self,
            f"{path} was created by another spout instance or an operator since this instance "
            "found none; this instance does not own the partition and stops committing",
        )
        self.path = path
        self.expected_version = -1  # -1: we expected no record at all


class OutputFailed(GiveUp):
    """Kafka did not acknowledge some outputs: their source messages must not be acked."""

    def __init__(self, topic: str, failures: list[tuple[str, str]]) -> None:
        self.topic = topic
        self.failures = failures  # (output id, Kafka's error) per unacknowledged output
        output, error = failures[0]
        super().__init__(
            f"{count(len(failures), 'output')} to {topic} not acknowledged by Kafka (first: "
            f"{output}: {error}); the source message fails and is retried, its outputs re-sent "
            "with the same ids; check that the topic exists and this client may write to it"
        )


class OutputUnavailable(OutputFailed, KafkaUnavailable):
    """Every unacknowledged output failed for an outage of the output's Kafka (see
    `kspout.output`): the source message is released, no attempt spent, and sent again later."""

    def __init__(self, topic: str, failures: list[tuple[str, str]]) -> None:
        super().__init__(topic, failures)
        output, error = failures[0]
        self.args = (
            f"{count(len(failures), 'output')} to {topic} not acknowledged: its Kafka is "
            f"unreachable or has no leader for them (first: {output}: {error}); the source "
            "message is released, no attempt spent, and its outputs are sent again once Kafka "
            "answers",
        )
