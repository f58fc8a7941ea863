"""`kspout produce`: write messages to a config's topic, so a first run needs no script.

The messages come from a file (`--file F`, `-` for stdin), one per line, or from a generator of
N test messages (`--count N`): values `{"id": "msg-000001", "n": 1}` keyed by their id, so the
keys spread over the partitions and the dedup bolt's default `id_source = "key"` finds an id.
The command waits until Kafka acknowledged every message, then prints how many each partition
received and at which offsets.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict
from typing import BinaryIO

import click
from rich.table import Table

from kspout.cli.answers import echo_json, stdout_console
from kspout.cli.group import main
from kspout.cli.options import NotThere, config_option, dev_option, json_option, kspout_errors
from kspout.config import TopicConfig, load_config
from kspout.errors import TopicNotFound
from kspout.kafka import KafkaMetadata
from kspout.kafka.topics import ensure_topic
from kspout.kafka.writer import TopicWriter, Written

KeyValue = tuple[bytes | None, bytes]  # one message: its key, its value


def numbered_messages(count: int) -> Iterator[KeyValue]:
    """`count` JSON messages with ids msg-000001, msg-000002, ... as their keys."""
    for n in range(1, count + 1):
        msg_id = f"msg-{n:06d}"
        yield msg_id.encode(), json.dumps({"id": msg_id, "n": n}).encode()


def file_messages(lines: BinaryIO, keyed: bool) -> list[KeyValue]:
    """One message per non-empty line (without its line ending); with `keyed`, each line is
    `KEY<TAB>VALUE`, split at the first tab. Read whole first, so a bad line writes nothing."""
    messages: list[KeyValue] = []
    for number, raw in enumerate(lines, start=1):
        line = raw.rstrip(b"\r\n")
        if not line:
            continue
        if not keyed:
            messages.append((None, line))
            continue
        key, tab, value = line.partition(b"\t")
        if not tab:
            raise click.BadParameter(
                f"line {number} has no tab: with --keys every line is KEY<TAB>VALUE",
                param_hint="--file",
            )
        messages.append((key, value))
    return messages


def _partitions(config: TopicConfig, create: int | None) -> list[int]:
    """The topic's partitions; a missing topic is created with `create` partitions, or refused
    as every command refuses it (exit code 3), naming the option that creates it."""
    with KafkaMetadata(config) as kafka:
        try:
            return kafka.require_topic(config.topic)
        except TopicNotFound as missing:
            if create is None:
                raise NotThere(f"{missing} (--create-topic PARTITIONS creates it)") from None
    ensure_topic(config, create)
    return list(range(create))


def _json(topic: str, rows: list[Written]) -> dict[str, object]:
    total = sum(w.messages for w in rows)
    return {"topic": topic, "messages": total, "partitions": [asdict(w) for w in rows]}


def _table(topic: str, rows: list[Written]) -> Table:
    total = sum(w.messages for w in rows)
    table = Table(title=f"{topic}: {total} message{'' if total == 1 else 's'} written")
    for column in ("partition", "messages", "first offset", "last offset"):
        table.add_column(column, justify="right")
    for w in rows:
        first, last = ("-", "-") if w.messages == 0 else (str(w.first_offset), str(w.last_offset))
        table.add_row(str(w.partition), str(w.messages), first, last)
    table.add_section()
    table.add_row("total", str(total), "", "")
    return table


@main.command()
@config_option
@dev_option()
@click.option(
    "--file",
    "source",
    type=click.File("rb"),
    help="Write each non-empty line of this file as one message; - reads stdin.",
)
@click.option(
    "--keys",
    "keyed",
    is_flag=True,
    help="With --file: each line is KEY<TAB>VALUE (split at the first tab); without it the "
    "line is the value and the message has no key.",
)
@click.option(
    "--count",
    type=click.IntRange(min=1),
    metavar="N",
    help='Write N test messages: {"id": "msg-000001", "n": 1}, ... keyed by their id.',
)
@click.option(
    "--create-topic",
    "create",
    type=click.IntRange(min=1),
    metavar="PARTITIONS",
    help="Create the topic with this many partitions when it does not exist (without it, a "
    "missing topic is refused).",
)
@json_option
def produce(
    config_path: str,
    source: BinaryIO | None,
    keyed: bool,
    count: int | None,
    create: int | None,
    as_json: bool,
) -> None:
    """Write messages to the topic file's topic, and wait until Kafka acknowledged each.

    Give --file FILE (one message per line, - for stdin) or --count N (test messages). Prints
    how many messages each partition received and their first and last offsets (--json:
    {"topic", "messages", "partitions": [{"partition", "messages", "first_offset",
    "last_offset"}]}).
    """
    if source is not None and count is None:
        messages: Iterable[KeyValue] = file_messages(source, keyed)
    elif count is not None and source is None and not keyed:
        messages = numbered_messages(count)
    else:
        raise click.UsageError(
            "give --file FILE (- for stdin, --keys for KEY<TAB>VALUE lines) or --count N"
        )
    with kspout_errors():
        config = load_config(config_path)
        partitions = _partitions(config, create)
        with TopicWriter(config) as writer:
            written = writer.write(messages)
    rows = [written.get(p, Written(p)) for p in sorted(set(partitions) | set(written))]
    if as_json:
        echo_json(_json(config.topic, rows))
    else:
        stdout_console().print(_table(config.topic, rows))
