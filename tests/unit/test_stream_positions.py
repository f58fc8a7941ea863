"""The stream's offsets as Spark checkpoints them: Spark's Kafka-source shape, with each
partition's leader epoch beside it, and checkpoints written before kspout kept epochs read as
they are. Pure logic."""

from __future__ import annotations

import json

import pytest

from kspout.streaming.errors import CheckpointTopicMismatch
from kspout.streaming.positions import EPOCHS_KEY, StreamOffsets, decode, encode

OLD = '{"orders": {"0": 120, "1": 97}}'  # as kspout wrote it before it kept epochs
NEW = '{"orders": {"0": 120, "1": 97}, "kspout:leader_epochs": {"0": 3}}'


def test_a_checkpoint_without_epochs_is_read_and_written_back_as_it_was() -> None:
    offsets = decode("orders", json.loads(OLD))
    assert offsets == StreamOffsets({0: 120, 1: 97})
    assert offsets.anchors() == {}  # nothing to check until a batch gives them an epoch
    assert json.dumps(encode("orders", offsets)) == OLD


def test_epochs_sit_beside_the_topic_and_name_the_anchor_of_each_partition() -> None:
    offsets = decode("orders", json.loads(NEW))
    assert offsets == StreamOffsets({0: 120, 1: 97}, {0: 3})
    assert offsets.anchors() == {0: (120, 3)}
    # Spark tells "no new data" by comparing the JSON: the same offsets encode the same text.
    assert json.dumps(encode("orders", offsets)) == NEW
    assert encode("orders", StreamOffsets({1: 5, 0: 4}, {1: 2, 0: 2})) == {
        "orders": {"0": 4, "1": 5},
        EPOCHS_KEY: {"0": 2, "1": 2},
    }


def test_another_topics_checkpoint_is_refused_and_the_epochs_key_is_no_topic() -> None:
    other = json.loads(NEW.replace('"orders"', '"payments"'))
    with pytest.raises(CheckpointTopicMismatch) as refused:
        decode("orders", other)
    assert refused.value.stored == ["payments"]
    assert "give this query a new checkpointLocation" in str(refused.value)
    with pytest.raises(CheckpointTopicMismatch):
        decode("orders", {**json.loads(NEW), "payments": {"0": 1}})
