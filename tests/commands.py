"""The `kspout` command tree as a user sees it, for tests that walk it."""

from __future__ import annotations

import click


def subcommands(group: click.Group) -> dict[str, click.Command]:
    """The group's commands by name, those extensions add (`kspout demo`) included."""
    ctx = click.Context(group)
    found = {name: group.get_command(ctx, name) for name in group.list_commands(ctx)}
    return {name: command for name, command in found.items() if command is not None}
