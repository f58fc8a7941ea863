"""Topic files: the shipped examples load, every mistake names file + key + allowed values,
the environment overrides connections, and secrets never reach a repr."""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path

import pytest

from kspout.config import TopicConfig, load_config
from kspout.errors import ConfigError
from kspout.policy import (
    Backoff,
    BehindPolicy,
    ExhaustedPolicy,
    PartitionPolicy,
    Position,
    PositionKind,
)

TOPICS_DIR = Path(__file__).resolve().parents[2] / "deploy" / "topics"
TOPIC_FILES = sorted(TOPICS_DIR.glob("*.toml"))

MINIMAL = 'topic = "orders"\nspout_id = "orders-billing"\n'

WriteTopic = Callable[[str], Path]


def config_error(path: Path) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return info.value


# -- the shipped examples ----------------------------------------------------------------------


def test_shipped_examples_exist() -> None:
    names = {p.name for p in TOPIC_FILES}
    assert {"demo.toml", "orders.example.toml"} <= names


@pytest.mark.parametrize("path", TOPIC_FILES, ids=lambda p: p.name)
def test_shipped_topic_file_loads(path: Path) -> None:
    config = load_config(path)
    assert config.topic and config.spout_id
    assert config.brokers == "127.0.0.1:9092"
    assert config.zookeeper == "127.0.0.1:2181"
    assert isinstance(config.partition_policy(), PartitionPolicy)
    assert config.dlq_topic != config.topic


def test_demo_file_is_the_demo_topic() -> None:
    """The README's first command consumes this: fast retries ending in the dead-letter topic."""
    config = load_config(TOPICS_DIR / "demo.toml")
    assert (config.topic, config.spout_id) == ("kspout.demo", "demo")
    assert config.batch_size <= 2000  # several batches per partition for 20,000 messages
    assert config.dlq_topic == "kspout.demo.dlq"
    policy = config.partition_policy()
    assert policy.max_retries == 2
    assert policy.backoff.initial == 0.2
    assert policy.on_exhausted is ExhaustedPolicy.DEAD_LETTER
    assert policy.message_timeout == 10
    assert config.commit_interval == 1


def test_orders_example_shows_every_key() -> None:
    """The annotated example sets every key kspout accepts, in every table, so it documents
    them all (a key added to TopicConfig must be added to the example too)."""
    data = tomllib.loads((TOPICS_DIR / "orders.example.toml").read_text(encoding="utf-8"))
    assert set(data) == set(TopicConfig.model_fields)
    for section in (
        "retry_backoff",
        "infra_backoff",
        "metrics",
        "zookeeper_auth",
        "redis",
        "dedup",
    ):
        model = type(getattr(load_config(TOPICS_DIR / "orders.example.toml"), section))
        assert set(data[section]) == set(model.model_fields), section
    kafka = data["kafka"]
    assert kafka["security.protocol"] == "SASL_SSL"
    assert {"sasl.mechanism", "sasl.username", "sasl.password", "ssl.ca.location"} <= set(kafka)


# -- errors: file, key, allowed values ---------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "key", "mentions"),
    [
        pytest.param(
            MINIMAL + "colour = 1\n",
            "colour",
            ["unknown key", "max_retries", "spout_id", "behind_policy"],
            id="unknown-top-level",
        ),
        pytest.param(
            MINIMAL + "[retry_backoff]\njitter = 0.1\n",
            "retry_backoff.jitter",
            ["unknown key", "initial", "multiplier", "max"],
            id="unknown-in-retry_backoff",
        ),
        pytest.param(
            MINIMAL + '[zookeeper_auth]\ncredential = "u:p"\nuser = "u"\n',
            "zookeeper_auth.user",
            ["unknown key", "credential", "scheme"],
            id="unknown-in-zookeeper_auth",
        ),
        pytest.param(
            MINIMAL + 'behind_policy = "drop"\n',
            "behind_policy",
            ["'retry'", "'dead_letter'", "'skip'", "drop"],
            id="bad-behind_policy",
        ),
        pytest.param(
            MINIMAL + 'on_retries_exhausted = "retry"\n',
            "on_retries_exhausted",
            ["'dead_letter'", "'skip'"],
            id="bad-on_retries_exhausted",
        ),
        pytest.param(
            MINIMAL + 'start = "fail"\n',
            "start",
            ["earliest", "latest", "timestamp:<ms>", "'fail'"],
            id="start-cannot-fail",
        ),
        pytest.param(
            MINIMAL + 'start = "timestamp:yesterday"\n',
            "start",
            ["milliseconds", "yesterday"],
            id="bad-start-timestamp",
        ),
        pytest.param(
            MINIMAL + 'out_of_range = "newest"\n',
            "out_of_range",
            ["earliest", "latest", "fail", "timestamp:<ms>", "newest"],
            id="bad-out_of_range",
        ),
        pytest.param(
            MINIMAL + "max_retries = -1\n",
            "max_retries",
            [">= 0", '"unlimited"', "-1"],  # storm-kafka's -1 meant unlimited: say what does
            id="negative-max_retries",
        ),
        pytest.param(
            MINIMAL + "batch_size = -5\n",
            "batch_size",
            ["greater than 0", "-5"],
            id="negative-batch_size",
        ),
        pytest.param(
            MINIMAL + "message_timeout = -1.5\n",
            "message_timeout",
            ["greater than 0", "-1.5"],
            id="negative-message_timeout",
        ),
        pytest.param(
            MINIMAL + "max_offset_behind = 0\n",
            "max_offset_behind",
            ["greater than 0", "0"],
            id="zero-max_offset_behind",
        ),
        pytest.param(
            MINIMAL + "[retry_backoff]\ninitial = -0.5\n",
            "retry_backoff.initial",
            ["greater than or equal to 0", "-0.5"],
            id="negative-backoff",
        ),
        pytest.param(
            MINIMAL + "[infra_backoff]\nmultiplier = 0.5\n",
            "infra_backoff.multiplier",
            ["greater than or equal to 1", "0.5"],
            id="shrinking-infra_backoff",
        ),
        pytest.param(
            MINIMAL + '[dedup]\nid_source = "body"\n',
            "dedup.id_source",
            ["key", "header:<name>", "json:<field>", "body"],
            id="bad-dedup-id_source",
        ),
        pytest.param(
            'topic = "orders"\n',
            "spout_id",
            ["required"],
            id="missing-spout_id",
        ),
        pytest.param(
            MINIMAL + 'max_retries = "three"\n',
            "max_retries",
            ["integer", '"unlimited"', "three"],
            id="wrong-type",
        ),
        pytest.param(
            MINIMAL + "max_retries = 2.5\n",
            "max_retries",
            ["integer", '"unlimited"', "2.5"],
            id="fractional-max_retries",
        ),
        pytest.param(
            MINIMAL + "max_tasks_per_partition = 2\n",
            "max_tasks_per_partition",
            ['ordering = "key"', "allowed: 1"],
            id="split-without-key-order",
        ),
        pytest.param(
            MINIMAL + 'ordering = "offset"\n',
            "ordering",
            ["'none'", "'key'", "offset"],
            id="unknown-ordering",
        ),
        pytest.param(
            MINIMAL + 'max_retries = "Unlimited"\n',
            "max_retries",
            ['"unlimited"', "Unlimited"],
            id="miscased-unlimited",
        ),
    ],
)
def test_invalid_value_names_file_key_and_allowed_values(
    write_topic: WriteTopic, text: str, key: str, mentions: list[str]
) -> None:
    path = write_topic(text)
    err = config_error(path)
    assert (err.path, err.key) == (str(path), key)
    message = str(err)
    assert str(path) in message
    assert key in message
    for fragment in mentions:
        assert fragment in message, f"{fragment!r} missing from {message!r}"


@pytest.mark.parametrize("owned", ["bootstrap.servers", "group.id"])
def test_kafka_table_refuses_settings_kspout_owns(write_topic: WriteTopic, owned: str) -> None:
    path = write_topic(MINIMAL + f'[kafka]\n"{owned}" = "x"\n"client.id" = "c"\n')
    err = config_error(path)
    assert err.key == "kafka"
    assert str(path) in str(err) and owned in str(err)
    assert "brokers" in str(err), "says where bootstrap servers go instead"


def test_malformed_toml_names_the_file(write_topic: WriteTopic) -> None:
    path = write_topic(MINIMAL + "max_retries = \n")
    err = config_error(path)
    assert err.path == str(path) and str(path) in str(err)
    assert "not valid TOML" in str(err)
    assert "line 3" in str(err), "the parser's position is kept"


def test_non_utf8_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes(MINIMAL.encode() + b'topology_name = "caf\xe9"\n')
    err = config_error(path)
    assert str(path) in str(err) and "not valid TOML" in str(err)


@pytest.mark.parametrize("kind", ["missing", "directory"])
def test_unreadable_file_is_a_config_error(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "nope.toml"
    if kind == "directory":
        path.mkdir()
    err = config_error(path)
    assert err.path == str(path) and err.key is None
    assert str(path) in str(err) and "cannot read" in str(err)


# -- strict values, kspout's own words, "did you mean" -----------------------------------------


@pytest.mark.parametrize(
    ("line", "key", "mentions"),
    [
        pytest.param("batch_size = true", "batch_size", ["integer", "got true"], id="bool-int"),
        pytest.param('batch_size = "100"', "batch_size", ["integer", 'got "100"'], id="str-int"),
        pytest.param("batch_size = 100.0", "batch_size", ["integer", "got 100.0"], id="float-int"),
        pytest.param(
            'message_timeout = "30"', "message_timeout", ["number", 'got "30"'], id="str-float"
        ),
        pytest.param("message_timeout = true", "message_timeout", ["number"], id="bool-float"),
        pytest.param('max_offset_behind = "5"', "max_offset_behind", ["integer"], id="str-opt"),
        pytest.param(
            '[redis]\ncluster = "yes"', "redis.cluster", ["true or false", '"yes"'], id="str-bool"
        ),
        pytest.param("topology_name = 7", "topology_name", ["string", "got 7"], id="int-str"),
        pytest.param("retry_backoff = 3", "retry_backoff", ["table"], id="value-for-table"),
        pytest.param(
            'topic = "t"\nspout_id = "a/b"', "spout_id", ["'/'", "ZooKeeper node"], id="slash"
        ),
        pytest.param('zk_root = "kspout"', "zk_root", ["start", "'/'", "e.g."], id="zk_root"),
        pytest.param('topic = ""\nspout_id = "s"', "topic", ["must not be empty"], id="empty"),
        pytest.param("[metrics]\nport = 70000", "metrics.port", ["at most 65535"], id="le"),
    ],
)
def test_values_are_strict_and_messages_are_kspouts_own(
    write_topic: WriteTopic, line: str, key: str, mentions: list[str]
) -> None:
    """No silent coercion (a string or a boolean is never a number), and never pydantic's
    wording ("Input should be", "String should match pattern")."""
    path = write_topic((line if line.startswith("topic") else MINIMAL + line) + "\n")
    err = config_error(path)
    assert (err.path, err.key) == (str(path), key)
    for fragment in mentions:
        assert fragment in err.message, f"{fragment!r} missing from {err.message!r}"
    assert "should" not in err.message and "pattern" not in err.message


def test_integers_are_fine_where_numbers_are(write_topic: WriteTopic) -> None:
    config = load_config(write_topic(MINIMAL + "message_timeout = 30\n[retry_backoff]\nmax = 7\n"))
    assert config.message_timeout == 30.0 and config.retry_backoff.max == 7.0


@pytest.mark.parametrize(
    ("text", "key", "guess"),
    [
        pytest.param(
            "[retry_backof]\ninitial = 1.0", "retry_backof", "[retry_backoff]", id="table"
        ),
        pytest.param("batch_sise = 5", "batch_sise", "`batch_size`", id="key"),
        pytest.param("[dedup]\nttls = 5", "dedup.ttls", "`ttl`", id="nested-key"),
        pytest.param(
            '[zookeper_auth]\ncredential = "u:p"', "zookeper_auth", "[zookeeper_auth]", id="auth"
        ),
    ],
)
def test_an_unknown_key_or_table_gets_the_nearest_known_one(
    write_topic: WriteTopic, text: str, key: str, guess: str
) -> None:
    err = config_error(write_topic(MINIMAL + text + "\n"))
    assert err.key == key
    assert f"did you mean {guess}?" in err.message
    assert "allowed" in err.message, "every allowed key is listed too"


def test_an_unknown_key_like_none_gets_no_guess(write_topic: WriteTopic) -> None:
    err = config_error(write_topic(MINIMAL + "zzzz = 1\n"))
    assert "did you mean" not in err.message and "unknown key" in err.message


def test_problems_are_counted_by_key_not_by_pydantics_union_members(
    write_topic: WriteTopic,
) -> None:
    err = config_error(write_topic(MINIMAL + '[kafka]\n"sasl.password" = ["s3cret"]\n'))
    assert err.key == "kafka.sasl.password"
    assert "more problem" not in err.message
    assert "s3cret" not in str(err), "a [kafka] value may be a secret: never echoed"


# -- environment overrides ---------------------------------------------------------------------


def test_environment_overrides_connection_settings(
    write_topic: WriteTopic, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_topic(
        MINIMAL + 'brokers = "file-kafka:9092"\nzookeeper = "file-zk:2181"\n'
        '[redis]\nurl = "redis://file-redis:6379/0"\n'
    )
    plain = load_config(path)
    assert (plain.brokers, plain.zookeeper) == ("file-kafka:9092", "file-zk:2181")
    assert plain.redis_args()["url"] == "redis://file-redis:6379/0"

    monkeypatch.setenv("KSPOUT_BROKERS", "env-kafka:19092")
    monkeypatch.setenv("KSPOUT_ZOOKEEPER", "env-zk:12181")
    monkeypatch.setenv("KSPOUT_REDIS_URL", "redis://env-redis:16379/2")
    config = load_config(path)
    assert config.brokers == "env-kafka:19092"
    assert config.kafka_config()["bootstrap.servers"] == "env-kafka:19092"
    assert config.zookeeper == "env-zk:12181"
    assert config.kazoo_args()["hosts"] == "env-zk:12181"
    assert config.redis_args()["url"] == "redis://env-redis:16379/2"


def test_origin_says_where_a_connection_setting_came_from(
    write_topic: WriteTopic, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Errors of a server that does not answer name the key, the file and the variable."""
    path = write_topic(MINIMAL + 'brokers = "file-kafka:9092"\n')
    config = load_config(path)
    assert (
        config.origin("brokers")
        == f"`brokers` in {path} (or the environment variable KSPOUT_BROKERS)"
    )
    assert "default" in config.origin("zookeeper") and "KSPOUT_ZOOKEEPER" in config.origin(
        "zookeeper"
    )
    monkeypatch.setenv("KSPOUT_BROKERS", "env-kafka:19092")
    assert load_config(path).origin("brokers") == (
        f"`brokers` from the environment variable KSPOUT_BROKERS (it overrides {path})"
    )
    monkeypatch.setenv("KSPOUT_REDIS_URL", "redis://env-redis:16379/2")
    assert "KSPOUT_REDIS_URL" in load_config(path).origin("redis.url")


def test_empty_environment_variable_does_not_override(
    write_topic: WriteTopic, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KSPOUT_BROKERS", "")
    config = load_config(write_topic(MINIMAL + 'brokers = "file-kafka:9092"\n'))
    assert config.brokers == "file-kafka:9092"


# -- conversions -------------------------------------------------------------------------------


# PartitionPolicy fields no topic key sets (each needs a reason).
NOT_FROM_FILE = {
    "defer_delay",  # wait before re-offering a DEFERRED offset: fixed, not yet a topic key
}


def test_partition_policy_maps_every_field(write_topic: WriteTopic) -> None:
    path = write_topic(
        MINIMAL
        + """
max_retries = 7
on_retries_exhausted = "skip"
max_offset_behind = 1234
behind_policy = "dead_letter"
message_timeout = 42.5
max_uncommitted = 999
out_of_range = "timestamp:1700000000000"
[retry_backoff]
initial = 0.25
multiplier = 3.0
max = 9.0
"""
    )
    policy = load_config(path).partition_policy()
    assert policy == PartitionPolicy(
        max_retries=7,
        backoff=Backoff(0.25, 3.0, 9.0),
        on_exhausted=ExhaustedPolicy.SKIP,
        max_offset_behind=1234,
        behind_policy=BehindPolicy.DEAD_LETTER,
        message_timeout=42.5,
        max_uncommitted=999,
        out_of_range=Position(PositionKind.TIMESTAMP, 1_700_000_000_000),
    )
    default = PartitionPolicy()
    for f in fields(PartitionPolicy):
        if f.name in NOT_FROM_FILE:
            continue
        assert getattr(policy, f.name) != getattr(default, f.name), f"{f.name} is not mapped"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("earliest", Position(PositionKind.EARLIEST)),
        ("LATEST", Position(PositionKind.LATEST)),
        ("fail", Position(PositionKind.FAIL)),
        ("timestamp:0", Position(PositionKind.TIMESTAMP, 0)),
    ],
)
def test_out_of_range_values_parse(write_topic: WriteTopic, text: str, expected: Position) -> None:
    config = load_config(write_topic(MINIMAL + f'out_of_range = "{text}"\n'))
    assert config.out_of_range == expected
    assert config.partition_policy().out_of_range == expected


def test_unlimited_max_retries_is_a_budget_that_never_ends(write_topic: WriteTopic) -> None:
    """storm-kafka retried for ever by default (`retryLimit = -1`); here that is spelled out."""
    config = load_config(write_topic(MINIMAL + 'max_retries = "unlimited"\n'))
    assert config.max_retries == "unlimited"
    policy = config.partition_policy()
    assert policy.max_retries is None
    assert not policy.exhausted(10**12)
    counted = load_config(write_topic(MINIMAL + "max_retries = 0\n")).partition_policy()
    assert counted.exhausted(1), "0 means no retry (in storm-kafka, 0 meant unlimited too)"


def test_derived_paths_and_defaults(write_topic: WriteTopic) -> None:
    config = load_config(write_topic(MINIMAL + 'zk_root = "/storm/kafka"\n'))
    assert config.zk_spout_path == "/storm/kafka/orders-billing"
    assert config.dlq_topic == "orders.dlq"
    assert config.start == Position(PositionKind.EARLIEST)
    assert config.partition_policy() == PartitionPolicy()


def test_infra_backoff_parses_and_has_its_own_defaults(write_topic: WriteTopic) -> None:
    """The circuit breaker's waits: a section of their own, independent of `[retry_backoff]`."""
    default = load_config(write_topic(MINIMAL)).infra_backoff
    assert (default.initial, default.multiplier, default.max) == (1.0, 2.0, 30.0)
    path = write_topic(MINIMAL + "[infra_backoff]\ninitial = 0.25\nmultiplier = 3\nmax = 12.5\n")
    config = load_config(path)
    backoff = config.infra_backoff
    assert (backoff.initial, backoff.multiplier, backoff.max) == (0.25, 3.0, 12.5)
    assert config.retry_backoff == load_config(write_topic(MINIMAL)).retry_backoff, "untouched"


# -- secrets -----------------------------------------------------------------------------------

REDIS_PASSWORD = "redis-s3cret-pw"
ZK_PASSWORD = "zk-s3cret-pw"
SASL_PASSWORD = "sasl-s3cret-pw"


def test_secrets_do_not_appear_in_repr(write_topic: WriteTopic) -> None:
    path = write_topic(
        MINIMAL
        + f"""
[redis]
username = "kspout"
password = "{REDIS_PASSWORD}"
[zookeeper_auth]
credential = "kspout:{ZK_PASSWORD}"
"""
    )
    config = load_config(path)
    for text in (repr(config), str(config), repr(config.redis), repr(config.zookeeper_auth)):
        assert REDIS_PASSWORD not in text
        assert ZK_PASSWORD not in text
    # ... but the clients still get them.
    assert config.redis_args()["password"] == REDIS_PASSWORD
    assert config.redis_args()["username"] == "kspout"
    assert config.kazoo_args()["auth_data"] == [("digest", f"kspout:{ZK_PASSWORD}")]


def test_kafka_sasl_password_does_not_appear_in_repr(write_topic: WriteTopic) -> None:
    """`[kafka] "sasl.password"` is a password too (style: secret types for passwords): it must
    reach librdkafka but not a log line that prints the config."""
    path = write_topic(MINIMAL + f'[kafka]\n"sasl.password" = "{SASL_PASSWORD}"\n')
    config = load_config(path)
    assert config.kafka_config()["sasl.password"] == SASL_PASSWORD
    assert SASL_PASSWORD not in repr(config)


def test_config_error_does_not_echo_kafka_secrets(write_topic: WriteTopic) -> None:
    """A mistake elsewhere in `[kafka]` must not print the SASL password in the error."""
    path = write_topic(
        MINIMAL + f'[kafka]\n"group.id" = "mine"\n"sasl.password" = "{SASL_PASSWORD}"\n'
    )
    err = config_error(path)
    assert "group.id" in str(err)
    assert SASL_PASSWORD not in str(err)
