"""Fixtures shared by the unit tests of topic files."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

ENV_VARS = ("KSPOUT_BROKERS", "KSPOUT_ZOOKEEPER", "KSPOUT_REDIS_URL")

WriteTopic = Callable[[str], Path]


@pytest.fixture(autouse=True)
def _no_env_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    """The developer's shell (e.g. after `kspout dev up`) must not leak into these tests."""
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def write_topic(tmp_path: Path) -> WriteTopic:
    """Factory: write TOML text to a fresh topic file and return its path."""
    counter = iter(range(1_000_000))

    def write(text: str) -> Path:
        path = tmp_path / f"topic-{next(counter)}.toml"
        path.write_text(text, encoding="utf-8")
        return path

    return write
