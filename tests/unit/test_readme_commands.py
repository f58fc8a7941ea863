"""README and the commands agree: every `kspout ...` command README shows (in shell blocks and
inline code) names commands and options that exist, and the README describes every command.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import click

from kspout.cli import main
from tests.commands import subcommands

README = Path(__file__).parents[2] / "README.md"
SHELL_BLOCK = re.compile(r"```(?:bash|sh|console)\n(.*?)```", re.S)
INLINE = re.compile(r"`(kspout [^`]+)`")


def shown_commands() -> Iterator[str]:
    """Each `kspout ...` command line README shows, without its comment."""
    text = README.read_text()
    for block in SHELL_BLOCK.findall(text):
        for line in block.splitlines():
            line = line.split("  #")[0].strip()
            if line.startswith("kspout "):
                yield line
    yield from INLINE.findall(text)


def words(line: str) -> list[str]:
    """The command's words, without shell syntax README uses for choices (`[--json]`, `a|b`,
    `<instance>`, `...`)."""
    line = line.replace("[", " ").replace("]", " ").replace(" | ", "|")
    return [w for w in shlex.split(line.split("||")[0]) if w != "..."]


def commands_named(argv: list[str]) -> Iterator[tuple[click.Command, list[str]]]:
    """The command each alternative of `argv` names (`show|set` is two), and the rest."""
    command: click.Command = main
    for i, word in enumerate(argv):
        if not isinstance(command, click.Group) or word.startswith("-"):
            yield command, argv[i:]
            return
        alternatives = word.split("|")
        commands = subcommands(command)
        unknown = [w for w in alternatives if w not in commands]
        assert not unknown, f"README names `kspout {' '.join(argv[: i + 1])}`: no such command"
        if len(alternatives) > 1:
            for alternative in alternatives:
                yield from commands_named([*argv[:i], alternative, *argv[i + 1 :]])
            return
        command = commands[word]
    yield command, []


def test_every_command_and_option_readme_shows_exists() -> None:
    lines = list(shown_commands())
    assert len(lines) > 30
    for line in lines:
        for command, rest in commands_named(words(line)[1:]):
            options = {opt for param in command.params for opt in param.opts}
            named = {w.split("=")[0] for w in rest if w.startswith("--")}
            assert named <= options | {"--help"}, f"`{line}`: {sorted(named - options)} unknown"


def test_readme_shows_every_command() -> None:
    shown = " ".join(" ".join(words(line)) for line in shown_commands())

    def leaves(group: click.Group, prefix: str) -> Iterator[str]:
        for name, command in subcommands(group).items():
            if isinstance(command, click.Group):
                yield from leaves(command, f"{prefix} {name}")
            else:
                yield f"{prefix} {name}"

    for name in leaves(main, "kspout"):
        group, _, leaf = name.rpartition(" ")
        assert name in shown or re.search(rf"{group} [\w|]*\b{leaf}\b", shown), name
