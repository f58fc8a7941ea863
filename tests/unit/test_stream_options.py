"""`format("kspout")`'s options: Spark's Kafka-source names mapped onto kspout's settings, the
refusals, the batch read's ends and `minOffsetsPerTrigger`'s gate. Pure logic: no Kafka."""

from __future__ import annotations

from pathlib import Path

import pytest

from kspout.errors import ConfigError
from kspout.policy import Position, PositionKind
from kspout.streaming.batch import ends
from kspout.streaming.errors import StreamStopped
from kspout.streaming.options import EARLIEST, LATEST, WHERE, SourceSettings
from kspout.streaming.positions import MinTrigger

BROKERS = "k1:9092,k2:9092"
SPARK = {"kafka.bootstrap.servers": BROKERS, "subscribe": "orders"}


def error(options: dict[str, str]) -> str:
    with pytest.raises(ConfigError) as failed:
        SourceSettings.of(options)
    return str(failed.value)


def test_spark_names_map_onto_the_topic_config() -> None:
    settings = SourceSettings.of(
        {
            **SPARK,
            "startingOffsets": "latest",
            "failOnDataLoss": "false",
            "kafka.security.protocol": "SASL_SSL",
            "kafkaConsumer.pollTimeoutMs": "2500",
            "maxOffsetsPerTrigger": "1000",
            "minOffsetsPerTrigger": "10",
            "maxTriggerDelay": "2m",
            "includeHeaders": "true",
        }
    )
    config = settings.config
    assert (config.topic, config.brokers) == ("orders", BROKERS)
    assert config.start == Position(PositionKind.LATEST)
    assert config.out_of_range == Position(PositionKind.EARLIEST)
    assert config.kafka == {"security.protocol": "SASL_SSL"}
    assert config.fetch_timeout == 2.5
    assert (settings.max_offsets, settings.min_offsets) == (1000, 10)
    assert settings.max_trigger_delay == 120.0
    assert settings.config_path is None  # no topic file: no ZooKeeper copy

    fail = SourceSettings.of({**SPARK, "failOnDataLoss": "TRUE", "startingTimestamp": "1700"})
    assert fail.config.out_of_range == Position(PositionKind.FAIL)
    assert fail.config.start == Position(PositionKind.TIMESTAMP, 1700)


def test_options_override_the_topic_files_keys_and_keep_the_rest(tmp_path: Path) -> None:
    toml = tmp_path / "orders.toml"
    toml.write_text(
        'topic = "orders"\nspout_id = "s"\nbrokers = "file:9092"\nstart = "latest"\n'
        'out_of_range = "fail"\nmax_retries = 2\n[kafka]\n"client.id" = "from-file"\n'
    )
    settings = SourceSettings.of(
        {"CONFIG": str(toml), "subscribe": "orders", "startingOffsets": "earliest", **SPARK}
    )
    config = settings.config
    assert settings.config_path == str(toml)
    assert (config.brokers, config.start.kind) == (BROKERS, PositionKind.EARLIEST)
    assert config.out_of_range.kind is PositionKind.FAIL and config.max_retries == 2
    assert config.kafka == {"client.id": "from-file"}

    assert error({"config": str(toml), "subscribe": "payments"}) == (
        f"{WHERE}: subscribe: {toml} is topic 'orders', not 'payments': drop subscribe, or "
        "give the other topic's file"
    )


def test_json_offsets_are_per_partition_with_spark_s_special_values() -> None:
    settings = SourceSettings.of(
        {
            **SPARK,
            "startingOffsets": '{"orders": {"0": 23, "1": -2, "2": -1}}',
            "endingOffsets": '{"orders": {"0": 50, "1": -1}}',
        }
    )
    assert settings.starting == {0: 23, 1: EARLIEST, 2: LATEST}
    assert settings.ending == {0: 50, 1: LATEST}
    assert "this source reads 'orders' only" in error({**SPARK, "startingOffsets": '{"x": {}}'})
    assert "(got '0': -2)" in error({**SPARK, "endingOffsets": '{"orders": {"0": -2}}'})
    assert "endingOffsets: must be latest or JSON" in error({**SPARK, "endingOffsets": "earliest"})


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subscribePattern": "o.*"}, "subscribePattern: kspout reads one topic per source"),
        ({"assign": "{}"}, "assign: kspout reads every partition of its topic: use subscribe"),
        ({"minPartitions": "8"}, "minPartitions: kspout reads one task per Kafka partition"),
        ({"kafka.group.id": "g"}, "kafka.group.id: kspout assigns partitions itself"),
        ({"endingTimestamp": "1"}, "endingTimestamp: use endingOffsets"),
        ({"startingOfsets": "x"}, "startingofsets: unknown option; did you mean startingOffsets?"),
        ({"includeHeaders": "false"}, "includeHeaders: the rows always have headers"),
        ({"failOnDataLoss": "yes"}, "failOnDataLoss: must be true or false (got 'yes')"),
        ({"maxOffsetsPerTrigger": "0"}, "maxOffsetsPerTrigger: must be an integer >= 1"),
        ({"maxTriggerDelay": "5m"}, "maxTriggerDelay: applies with minOffsetsPerTrigger only"),
        (
            {"maxOffsetsPerTrigger": "10", "minOffsetsPerTrigger": "20"},
            "minOffsetsPerTrigger: must be <= maxOffsetsPerTrigger (10)",
        ),
        (
            {"startingOffsets": "earliest", "startingTimestamp": "1"},
            "startingTimestamp: give startingOffsets or it, not both",
        ),
    ],
)
def test_an_option_that_does_not_map_gets_one_line_saying_what_to_use(
    options: dict[str, str], message: str
) -> None:
    text = error({**SPARK, **options})
    assert text.startswith(f"{WHERE}: {message}") and "\n" not in text


def test_without_a_topic_file_subscribe_and_the_brokers_are_required(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("KSPOUT_BROKERS", raising=False)
    assert "subscribe: required: .option('subscribe', '<topic>')" in error({})
    assert "kafka.bootstrap.servers: required without a topic file" in error({"subscribe": "o"})
    monkeypatch.setenv("KSPOUT_BROKERS", "env:9092")
    assert SourceSettings.of({"subscribe": "o"}).config.brokers == "env:9092"


def test_stream_only_and_batch_only_options_are_refused_where_they_do_not_apply() -> None:
    with pytest.raises(ConfigError, match=r"endingOffsets: spark\.read only"):
        SourceSettings.of({**SPARK, "endingOffsets": "latest"}).for_stream()
    with pytest.raises(ConfigError, match="minOffsetsPerTrigger: streams only"):
        SourceSettings.of({**SPARK, "minOffsetsPerTrigger": "5"}).for_batch()
    with pytest.raises(ConfigError, match="startingOffsets: latest reads nothing"):
        SourceSettings.of({**SPARK, "startingOffsets": '{"orders": {"1": -1}}'}).for_batch()
    SourceSettings.of({**SPARK, "startingOffsets": "latest"}).for_stream()


def test_a_batch_read_ends_at_its_ending_offsets_at_most_at_high() -> None:
    highs, start = {0: 10, 1: 10, 2: 10}, {0: 0, 1: 2, 2: 3}
    assert ends({}, highs, start) == highs
    assert ends({0: 4, 1: LATEST, 2: 99}, highs, start) == {0: 4, 1: 10, 2: 10}
    with pytest.raises(ConfigError, match="partition 2 ends at 1, before its start at 3"):
        ends({2: 1}, highs, start)


def test_min_offsets_per_trigger_waits_for_rows_or_the_delay() -> None:
    gate = MinTrigger(min_rows=100, max_delay=60.0)
    assert gate.ready(5, now=0.0)  # the first batch never waits
    assert not gate.ready(50, now=30.0)
    assert gate.ready(100, now=31.0)
    assert not gate.ready(0, now=500.0)  # nothing to read: no batch, the delay still runs
    assert gate.ready(1, now=500.0)
    assert not gate.ready(1, now=501.0)


def test_a_stopped_stream_without_a_topic_file_says_how_to_go_on() -> None:
    with_file = StreamStopped("orders", 3, 20, 500, 900, "orders.toml")
    assert (
        with_file.command == "kspout offsets set --config orders.toml --partition 3 --to earliest"
    )
    assert f"run `{with_file.command}`" in str(with_file)
    without = StreamStopped("orders", 3, 20, 500, 900, None)
    assert without.command is None
    assert str(without) == (
        "orders[3]: offset 20 is out of range; Kafka holds [500, 900). failOnDataLoss is true "
        '(out_of_range = "fail"): set it to false to go on at the earliest offset Kafka holds, '
        "or give the query a new checkpointLocation"
    )
