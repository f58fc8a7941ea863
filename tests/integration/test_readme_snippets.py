"""README's snippets run as printed.

Every ```python block of README.md runs, in order, in one namespace (as a reader who pastes
them one after another would), in a directory holding the topic files the snippets name:
`orders.toml` and `orders-revenue.toml` (the same topic under another spout id), over the
session's stack, with JSON orders on the topic. A comment line before a block marks the
exceptions:

* `<!-- snippet: fragment (why) -->`: not run (it needs a server or topic the stack lacks; the
  reason names what runs it instead);
* `<!-- snippet: file NAME -->`: written to NAME, for a command to import;
* `<!-- snippet: run -->` before a ```bash block: each line runs in a shell there.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from confluent_kafka import Producer
from pyspark.sql import SparkSession

from kspout.config import TopicConfig
from kspout.devstack import DevStack
from tests.integration.helpers import PARTITIONS, topic_file

README = Path(__file__).parents[2] / "README.md"
BLOCK = re.compile(
    r"(?:<!-- snippet: (?P<mark>[^>]*?) -->\n)?```(?P<lang>\w*)\n(?P<code>.*?)```", re.S
)
COUNTRIES = ("fr", "de", "it")


@dataclass(frozen=True)
class Snippet:
    line: int  # where its block starts in README.md
    lang: str
    mark: str | None
    code: str


def snippets() -> list[Snippet]:
    text = README.read_text()
    return [
        Snippet(text.count("\n", 0, m.start("code")) + 1, m["lang"], m["mark"], m["code"])
        for m in BLOCK.finditer(text)
    ]


def orders(start: int, count: int) -> list[dict[str, object]]:
    """JSON orders; the first one's amount is negative (the first snippet's handler fails it)."""
    return [
        {"id": f"o-{n}", "country": COUNTRIES[n % 3], "cents": -5 if n == 0 else 100 + n}
        for n in range(start, start + count)
    ]


def revenue(placed: list[dict[str, object]]) -> dict[str, int]:
    totals: Counter[str] = Counter()
    for order in placed:
        totals[str(order["country"])] += int(str(order["cents"]))
    return dict(totals)


def place(producer: Producer, topic: str, placed: list[dict[str, object]]) -> None:
    for i, order in enumerate(placed):
        key = str(order["id"]).encode()
        producer.produce(topic, json.dumps(order).encode(), key, partition=i % len(PARTITIONS))
    assert producer.flush(10) == 0


@pytest.fixture
def workdir(
    tmp_path: Path,
    stack: DevStack,
    make_config: Callable[..., TopicConfig],
    monkeypatch: pytest.MonkeyPatch,
) -> Path:
    """A directory with the snippets' topic files; the current directory while the test runs."""
    dedup = textwrap.dedent(
        f"""\
        max_retries = 1
        [retry_backoff]
        initial = 0.05
        [dedup]
        id_source = "key"
        [redis]
        url = "{stack.info.redis_url}"
        """
    )
    config = make_config()
    topic_file(tmp_path / "orders.toml", stack, config, dedup)
    revenue_config = config.model_copy(update={"spout_id": f"{config.spout_id}-revenue"})
    topic_file(tmp_path / "orders-revenue.toml", stack, revenue_config, dedup)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_readme_marks_its_fragments_and_runs_the_rest() -> None:
    found = snippets()
    python = [s for s in found if s.lang == "python"]
    fragments = [s for s in python if s.mark is not None and s.mark.startswith("fragment")]
    assert len(python) >= 9 and len(fragments) <= 5, [s.line for s in fragments]
    for snippet in fragments:  # each names what runs it instead
        assert re.fullmatch(r"fragment \(.+\)", snippet.mark or ""), snippet.line
    assert all(s.mark in (None, "run") for s in found if s.lang != "python")


def test_readme_snippets_run_as_printed(
    workdir: Path,
    make_config: Callable[..., TopicConfig],
    spark: SparkSession,
    producer: Producer,
    redis_client: redis.Redis,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = make_config()
    first, later = orders(0, 40), orders(100, 30)  # later: placed before the shell command
    place(producer, config.topic, first)
    namespace: dict[str, object] = {"__name__": "__main__"}  # Spark pickles its classes by value
    ran = []
    for snippet in snippets():
        mark = snippet.mark or ""
        if snippet.lang == "python" and mark.startswith("file "):
            (workdir / mark.removeprefix("file ")).write_text(snippet.code)
        elif snippet.lang == "python" and not mark.startswith("fragment"):
            code = compile(snippet.code, f"README.md, line {snippet.line}", "exec")
            exec(code, namespace)  # running the README is the test
            ran.append(snippet.line)
        elif snippet.lang == "bash" and mark == "run":
            place(producer, config.topic, later)
            for line in snippet.code.splitlines():
                done = subprocess.run(line, shell=True, cwd=workdir, env=environment(), timeout=300)
                assert done.returncode == 0, line
            ran.append(snippet.line)
    assert len(ran) >= 5, ran

    # What the snippets did: the first run failed the negative order and acked the rest ...
    final = namespace["final"]
    assert (final.total("acked"), final.total("dead_lettered")) == (39, 1)  # type: ignore[attr-defined]
    assert "acked 39, dead-lettered 1, lag 0" in capsys.readouterr().out
    # ... the streaming query applied each order's revenue once ...
    streamed = redis_client.hgetall(f"{{{config.spout_id}-revenue}}:revenue")
    assert {k.decode(): int(v) for k, v in streamed.items()} == revenue(first)
    # ... and `kspout run` with the dedup bolt applied the orders placed after the spout's runs.
    applied = redis_client.hgetall(f"{{{config.spout_id}}}:revenue")
    assert {k.decode(): int(v) for k, v in applied.items()} == revenue(later)


def environment() -> dict[str, str]:
    """This interpreter's `kspout` first on PATH; no KSPOUT_ settings from outside."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KSPOUT_")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env
