"""Options and error handling shared by the `kspout` sub-commands."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import click

from kspout.errors import (
    KafkaUnreachable,
    KspoutError,
    RedisUnavailable,
    TopicNotFound,
    ZooKeeperUnavailable,
)

F = TypeVar("F", bound=Callable[..., Any])

config_option = click.option(
    "--config",
    "config_path",
    required=True,
    type=click.Path(dir_okay=False),
    help="The topic's TOML file.",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead.")


# Exit code of every command whose topic does not exist, or whose Kafka, ZooKeeper or Redis
# does not answer (what `status` and `lag` call "could not tell"); other errors exit 1, usage
# errors 2.
NOT_THERE = 3
NOT_THERE_ERRORS = (TopicNotFound, KafkaUnreachable, ZooKeeperUnavailable, RedisUnavailable)


class NotThere(click.ClickException):
    """The topic is missing, or Kafka, ZooKeeper or Redis does not answer: exit code
    `NOT_THERE`."""

    exit_code = NOT_THERE


@contextmanager
def kspout_errors() -> Iterator[None]:
    """kspout errors become one line on stderr, without a traceback: exit code `NOT_THERE`
    for a missing topic or a server that does not answer, 1 for any other."""
    try:
        yield
    except NOT_THERE_ERRORS as exc:
        raise NotThere(str(exc)) from None
    except KspoutError as exc:
        raise click.ClickException(str(exc)) from None


def partition_options(f: F) -> F:
    """`--partition N` (repeatable) and `--all`, as `chosen` and `every`."""
    f = click.option("--all", "every", is_flag=True, help="Every partition of the topic.")(f)
    return click.option("--partition", "chosen", type=int, multiple=True, help="Repeatable.")(f)


def chosen_partitions(
    topic: str, known: list[int], chosen: tuple[int, ...], every: bool
) -> list[int]:
    """The partitions `--partition`/`--all` name, checked against the topic's `known` ones."""
    if bool(chosen) == every:
        raise click.UsageError("pass --partition N (repeatable) or --all, not both")
    missing = sorted(set(chosen) - set(known))
    if missing:
        raise click.UsageError(
            f"topic {topic!r} has no partition {', '.join(map(str, missing))} "
            f"(it has {len(known)}: 0-{len(known) - 1})"
        )
    return sorted(set(chosen or known))
