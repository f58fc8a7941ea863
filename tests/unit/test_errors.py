"""kspout's errors: one root, and every class under exactly one next move."""

from __future__ import annotations

import inspect

import kspout.errors as errors
import kspout.streaming.errors as streaming_errors
from kspout.errors import FixSetup, GiveUp, KafkaUnavailable, KspoutError, RetryLater

GROUPS = (FixSetup, RetryLater, GiveUp)


def error_classes() -> list[type[KspoutError]]:
    found = [
        obj
        for module in (errors, streaming_errors)
        for _, obj in inspect.getmembers(module, inspect.isclass)
        if issubclass(obj, KspoutError) and obj not in (KspoutError, *GROUPS)
    ]
    return sorted(set(found), key=lambda cls: cls.__name__)


def test_every_error_is_under_exactly_one_next_move() -> None:
    groups = {
        cls.__name__: [g.__name__ for g in GROUPS if issubclass(cls, g)] for cls in error_classes()
    }
    # the one documented exception: an output outage is an OutputFailed and a Kafka outage
    assert groups.pop("OutputUnavailable") == ["RetryLater", "GiveUp"]
    assert {name: found for name, found in groups.items() if len(found) != 1} == {}


def test_a_missing_topic_is_a_setup_to_fix_not_an_outage() -> None:
    assert issubclass(errors.TopicNotFound, FixSetup)
    assert not issubclass(errors.TopicNotFound, KafkaUnavailable)
    assert issubclass(errors.KafkaUnreachable, RetryLater)
    assert issubclass(errors.OwnershipLost, GiveUp)
