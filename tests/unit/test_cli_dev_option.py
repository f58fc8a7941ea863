"""Every command that talks to Kafka, ZooKeeper or Redis takes `--dev`, with the same help."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from kspout.cli import main
from kspout.cli.options import DEV_HELP

COMMANDS = [
    ["status"],
    ["lag"],
    ["pause"],
    ["resume"],
    ["rebalance"],
    ["offsets", "show"],
    ["offsets", "set"],
    ["offsets", "reset"],
    ["dlq", "show"],
    ["dlq", "replay"],
    ["run"],
    ["produce"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_takes_dev(command: list[str]) -> None:
    result = CliRunner().invoke(main, [*command, "--help"], terminal_width=1000)
    assert result.exit_code == 0, result.output
    help_line = next(line for line in result.output.splitlines() if "--dev" in line)
    assert help_line.split(None, 1)[1].strip() == DEV_HELP
