"""`kspout pause|resume|rebalance`: operators' requests to the instances that own partitions.

Every request is a write to the spout's ownership nodes (`kspout.ownership.tree`), which the
owners watch: `pause` creates pause nodes (the owner stops planning there, lets what runs
finish, commits and acks), `resume` deletes them, `rebalance` writes the assignment (the owners
of moved partitions commit and release them; the new owners claim them and resume from that
commit, while the other partitions keep flowing).
"""

from __future__ import annotations

import time
from typing import Any

import click
from kazoo.exceptions import BadVersionError, NodeExistsError
from rich.console import Console

from kspout.cli.answers import change, echo_json, rows_table, stdout_console
from kspout.cli.group import main
from kspout.cli.options import (
    chosen_partitions,
    config_option,
    dev_option,
    json_option,
    kspout_errors,
    partition_options,
)
from kspout.cli.pausing import ack_timeout, operator, pause, resume, wait_for_acks
from kspout.config import load_config
from kspout.errors import NoLiveInstance, RebalanceNotDone
from kspout.kafka import KafkaMetadata
from kspout.ownership.assignment import Assignment, balance, moves
from kspout.ownership.tree import SpoutTree, read_ownership, write_assignment
from kspout.wording import count
from kspout.zk.record import now_ms
from kspout.zk.registry import live_instances
from kspout.zk.session import ZkSession

CLAIM_POLL = 0.2  # seconds between reads while waiting for moved partitions' new claims


@main.command(name="pause")
@config_option
@dev_option()
@partition_options
@click.option("--wait/--no-wait", default=True, help="Wait for the owners' acks (default).")
@json_option
def pause_partitions(
    config_path: str, chosen: tuple[int, ...], every: bool, wait: bool, as_json: bool
) -> None:
    """Stop planning new offsets on partitions; what runs there finishes and is committed.

    Prints a table: per partition, whether this call paused it, its owner and whether it acked
    (--json: {"topic", "spout", "action", "dry_run", "partitions"}).
    """
    with kspout_errors():
        config = load_config(config_path)
        with ZkSession(config) as session, KafkaMetadata(config) as kafka:
            partitions = chosen_partitions(
                config.topic, kafka.require_topic(config.topic), chosen, every
            )
            created = pause(session, partitions, "kspout pause")
            if wait:
                wait_for_acks(session, partitions, ack_timeout(config))
            own = read_ownership(session)
    rows = [
        {
            "partition": p,
            "changed": p in created,
            "paused": True,
            "owner": own.claims.get(p),
            "acked": p in own.paused and own.paused[p].acked_by is not None,
            "offset": own.paused[p].acked_offset if p in own.paused else None,
        }
        for p in partitions
    ]
    answer = change(config.topic, config.zk_spout_path, "pause", rows, dry_run=False)
    _print(answer, as_json, f"{config.topic}: paused {count(len(created), 'partition')}", PAUSED)


@main.command(name="resume")
@config_option
@dev_option()
@partition_options
@json_option
def resume_partitions(
    config_path: str, chosen: tuple[int, ...], every: bool, as_json: bool
) -> None:
    """Resume paused partitions (their owners plan them again).

    Prints a table: per partition, whether it was paused (--json as for `pause`).
    """
    with kspout_errors():
        config = load_config(config_path)
        with ZkSession(config) as session, KafkaMetadata(config) as kafka:
            partitions = chosen_partitions(
                config.topic, kafka.require_topic(config.topic), chosen, every
            )
            resumed = resume(session, partitions)
    rows = [{"partition": p, "changed": p in resumed, "paused": False} for p in partitions]
    answer = change(config.topic, config.zk_spout_path, "resume", rows, dry_run=False)
    _print(answer, as_json, f"{config.topic}: resumed {count(len(resumed), 'partition')}", RESUMED)


@main.command()
@config_option
@dev_option()
@click.option("--move", "move", help="Partitions to move, e.g. 3,5 (with --to).")
@click.option("--to", "target", help="The live instance (id or a unique prefix) to move them to.")
@click.option("--dry-run", is_flag=True, help="Print what would move; change nothing.")
@click.option("--wait/--no-wait", default=True, help="Wait until the new owners claimed them.")
@click.option("--timeout", type=float, default=120.0, show_default=True, help="Seconds to wait.")
@json_option
def rebalance(
    config_path: str,
    move: str | None,
    target: str | None,
    dry_run: bool,
    wait: bool,
    timeout: float,
    as_json: bool,
) -> None:
    """Balance the partitions over the live instances now, or move some to one instance.

    Moved partitions are committed by their old owner before it lets them go, and resumed from
    that commit by the new one; the others keep flowing. Prints the moves, partition, from and
    to (--json: {"topic", "spout", "action", "dry_run", "partitions"}). Exit code 1 when the
    moves did not finish within --timeout.
    """
    if (move is None) != (target is None):
        raise click.UsageError("--move and --to go together")
    with kspout_errors():
        config = load_config(config_path)
        with ZkSession(config) as session, KafkaMetadata(config) as kafka:
            partitions = kafka.require_topic(config.topic)
            live = live_instances(session)
            if not live:
                raise NoLiveInstance(session.path)
            found = session.read_node(SpoutTree(session.path).assignment)
            current = Assignment.decode(found[0]) if found is not None else Assignment()
            if move is None or target is None:
                owners = balance(partitions, live, current.owners)
            else:
                owners = _moved(
                    current.owners, _parse_move(move, partitions), _target(target, live)
                )
            changes = moves(current.owners, owners)
            if not dry_run and changes:
                new = Assignment(owners, tuple(live), tuple(partitions), operator(), now_ms())
                _write(session, new, None if found is None else found[1])
                if wait:
                    _wait_for_claims(session, {p: to for p, _, to in changes}, timeout)
    rows = [{"partition": p, "changed": True, "from": old, "to": to} for p, old, to in changes]
    answer = change(config.topic, config.zk_spout_path, "rebalance", rows, dry_run=dry_run)
    if rows or as_json:
        moved = count(len(rows), "partition")
        title = f"{config.topic}: {'would move' if dry_run else 'moved'} {moved}"
        _print(answer, as_json, title, MOVED)
    else:
        click.echo(f"{config.topic}: balanced already; nothing moves")


def _parse_move(text: str, partitions: list[int]) -> list[int]:
    try:
        chosen = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise click.BadParameter(
            f"expected partitions like 3,5, got {text!r}", param_hint="--move"
        ) from None
    missing = sorted(set(chosen) - set(partitions))
    if not chosen or missing:
        raise click.BadParameter(
            f"the topic has partitions 0-{len(partitions) - 1}; got {text!r}", param_hint="--move"
        )
    return chosen


def _target(text: str, live: list[str]) -> str:
    matches = [i for i in live if i == text] or [i for i in live if i.startswith(text)]
    if len(matches) != 1:
        raise click.BadParameter(
            f"{text!r} names {'no' if not matches else 'more than one'} live instance; live: "
            + ", ".join(live),
            param_hint="--to",
        )
    return matches[0]


def _moved(current: dict[int, str], partitions: list[int], target: str) -> dict[int, str]:
    out = dict(current)
    out.update(dict.fromkeys(partitions, target))
    return out


def _write(session: ZkSession, new: Assignment, version: int | None) -> None:
    """Compare-and-set the assignment (a leader may have balanced meanwhile: try again)."""
    try:
        write_assignment(session, new, version)
    except (BadVersionError, NodeExistsError):
        raise RebalanceNotDone(
            "the assignment changed while computing the moves (an instance joined or left): "
            "run the command again"
        ) from None


def _wait_for_claims(session: ZkSession, wanted: dict[int, str], timeout: float) -> None:
    """Until each moved partition is claimed by its new owner (`RebalanceNotDone` on timeout)."""
    deadline = time.monotonic() + timeout
    with Console(stderr=True).status(f"moving {count(len(wanted), 'partition')}"):
        while True:
            claims = read_ownership(session).claims
            late = {p: to for p, to in wanted.items() if claims.get(p) != to}
            if not late:
                return
            if time.monotonic() >= deadline:
                raise RebalanceNotDone(
                    f"partitions {sorted(late)} not claimed by their new owners within "
                    f"{timeout:g}s (their old owners may still run batches there); see "
                    "`kspout status`"
                )
            time.sleep(CLAIM_POLL)


# The table columns of each answer: row key -> header.
PAUSED = {
    "partition": "partition",
    "changed": "newly paused",
    "owner": "owner",
    "acked": "owner acked",
    "offset": "at offset",
}
RESUMED = {"partition": "partition", "changed": "was paused"}
MOVED = {"partition": "partition", "from": "from", "to": "to"}


def _print(answer: dict[str, Any], as_json: bool, title: str, headers: dict[str, str]) -> None:
    if as_json:
        echo_json(answer)
    else:
        stdout_console().print(rows_table(title, answer["partitions"], headers))
