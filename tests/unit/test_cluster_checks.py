"""check_cluster: a run's start-up checks wait out a cluster that cannot serve yet.

The checks are scripted (each answers from a list, on cue), to reach what a real cluster gives
only by chance: a controller election longer than one request's own retries. The same path
against a real hung broker is in tests/chaos/test_broker_faults.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from kspout.config import parse_config
from kspout.driver import cluster_checks
from kspout.errors import KafkaRequestFailed, TopicNotFound
from kspout.kafka._client import call_kafka

CONFIG = parse_config(
    {
        "topic": "t",
        "spout_id": "s",
        "infra_backoff": {"initial": 1.0, "multiplier": 2.0, "max": 4.0},
    }
)


def failed(code: int, *, fatal: bool = False) -> KafkaRequestFailed:
    """The failure `call_kafka` raises once its own tries of a request are spent."""

    def request() -> None:
        raise KafkaException(KafkaError(code, fatal=fatal))

    try:
        call_kafka("describe", "t", None, request, sleep=lambda _: None)
    except KafkaRequestFailed as exc:
        return exc
    raise AssertionError("call_kafka did not fail")


class Script:
    """Each check's answers in order (an exception is raised, None passes); the calls made."""

    def __init__(self, **answers: list[Exception | None]) -> None:
        self._answers: dict[str, Iterator[Exception | None]] = {
            name: iter(found) for name, found in answers.items()
        }
        self.calls: list[str] = []

    def check(self, name: str) -> Callable[..., None]:
        def answer(*_: Any) -> None:
            self.calls.append(name)
            found = next(self._answers.setdefault(name, iter([])), None)
            if found is not None:
                raise found

        return answer


@pytest.fixture
def sleeps() -> list[float]:
    return []


def run_checks(script: Script, sleeps: list[float], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster_checks, "require_spout_rights", script.check("rights"))
    monkeypatch.setattr(cluster_checks, "require_dead_letter_topic", script.check("dead letters"))
    metadata: Any = type("Metadata", (), {"require_topic": staticmethod(script.check("topic"))})
    cluster_checks.check_cluster(CONFIG, metadata, sleep=sleeps.append)


def test_a_transient_failure_is_asked_again_after_the_infra_backoffs_waits(
    sleeps: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    timed_out = failed(KafkaError._TIMED_OUT)
    assert timed_out.transient and "gave up after 5 tries" in str(timed_out)
    script = Script(topic=[timed_out, timed_out], rights=[timed_out, timed_out, None])
    run_checks(script, sleeps, monkeypatch)
    assert sleeps == [1.0, 2.0, 4.0, 4.0]  # initial, doubled, then capped at max
    assert script.calls == [
        *["topic"] * 3,
        "rights",
        "topic",
        "rights",
        "topic",
        "rights",
        "dead letters",
    ]


def test_a_failure_that_asking_again_cannot_cure_is_raised_at_once(
    sleeps: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    fenced = failed(KafkaError._FENCED, fatal=True)
    assert not fenced.transient
    with pytest.raises(KafkaRequestFailed) as caught:
        run_checks(Script(rights=[fenced]), sleeps, monkeypatch)
    assert caught.value is fenced and sleeps == []

    missing = TopicNotFound("t", "127.0.0.1:9", "t.toml", "`brokers` in t.toml")
    with pytest.raises(TopicNotFound):
        run_checks(Script(topic=[missing]), sleeps, monkeypatch)
    assert sleeps == []
