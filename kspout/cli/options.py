"""Options and error handling shared by the `kspout` sub-commands."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, TypeVar

import click

from kspout.devstack.state import find_stack
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
json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON object on stdout instead (for scripts)."
)
DEV_HELP = (
    "Connect to the running `kspout dev up` stack, found in ./.kspout-dev or the nearest "
    "parent folder's (as git finds a repository): its addresses replace the topic file's and "
    "KSPOUT_BROKERS, KSPOUT_ZOOKEEPER, KSPOUT_REDIS_URL. Without --dev no stack is used."
)

log = logging.getLogger(__name__)


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


def use_dev_stack() -> None:
    """Point the connection settings (`KSPOUT_BROKERS`, ...) at the nearest running dev stack.
    Raises StackError naming where it looked when none runs."""
    workdir, info = find_stack()
    os.environ.update(info.env())
    log.info("using the dev stack in %s", workdir)


def dev_option(
    errors: Callable[[], AbstractContextManager[None]] = kspout_errors,
) -> Callable[[F], F]:
    """`--dev`: `use_dev_stack()` before the command runs. `errors` turns a missing stack into
    the command's own kind of error (`could_not_tell` for `status` and `lag`: exit code 3)."""

    def apply(_ctx: click.Context, _param: click.Parameter, wanted: bool) -> None:
        if wanted:
            with errors():
                use_dev_stack()

    return click.option("--dev", is_flag=True, expose_value=False, callback=apply, help=DEV_HELP)


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
