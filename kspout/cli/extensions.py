"""Commands other installed packages add to `kspout`, declared as entry points.

A package names its click command in its metadata (pyproject's
`[project.entry-points."kspout.commands"]`, `name = "module:command"`). `kspout` lists the
names from the metadata and imports a command's module only when that command is named or
`kspout --help` asks for its one-line help, so the library never imports its extensions (the
demo, in `kspout_demo`, uses Redis and the dedup bolt; `kspout status` loads neither).
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import EntryPoint, entry_points

import click

ENTRY_POINT_GROUP = "kspout.commands"


@cache
def declared() -> dict[str, EntryPoint]:
    """The extension commands the installed packages declare, by name (read once: listing the
    commands asks for each)."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


class ExtensibleGroup(click.Group):
    """A group whose commands are its own plus those declared under `ENTRY_POINT_GROUP`; an
    own command wins a name both have."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *declared()})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        entry_point = declared().get(cmd_name)
        if command is not None or entry_point is None:
            return command
        command = entry_point.load()
        if not isinstance(command, click.Command):
            raise TypeError(
                f"the {ENTRY_POINT_GROUP} entry point {cmd_name} = {entry_point.value!r} is not "
                "a click command: point it at one (a function decorated with @click.command)"
            )
        self.add_command(command, cmd_name)
        return command
