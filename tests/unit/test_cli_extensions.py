"""The demo lives beside the library: `kspout` imports neither `kspout_demo` nor `dedup`, and
finds `kspout demo` through the `kspout.commands` entry points (`kspout.cli.extensions`), so
listing the commands and a command's help load no Redis code.

These need kspout installed from this tree (`pip install -e .`, as deploy/setup.sh does): the
entry points live in the installed metadata.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from click.testing import CliRunner

from kspout.cli import main
from kspout.cli.extensions import declared

KSPOUT = Path(sys.executable).with_name("kspout")
NOT_LOADED = ("redis", "hiredis", "dedup", "kspout_demo.jobs", "kspout_demo.run")

# Imports the library and runs `kspout --help` and `kspout status --help` in one fresh
# interpreter, then prints what they printed and which of NOT_LOADED were imported.
CHILD = textwrap.dedent(
    """\
    import contextlib, io, json, sys
    import kspout, kspout.cli
    out = io.StringIO()
    for argv in (["--help"], ["status", "--help"]):
        with contextlib.redirect_stdout(out):
            kspout.cli.main(argv, prog_name="kspout", standalone_mode=False)
    print(json.dumps({
        "help": out.getvalue(),
        "loaded": sorted(m for m in sys.argv[1:] if m in sys.modules),
    }))
    """
)


def test_help_and_status_help_load_no_redis_dedup_or_demo_body() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, *NOT_LOADED], capture_output=True, text=True, check=True
    )
    answer = json.loads(done.stdout)
    assert answer["loaded"] == []
    assert "  demo " in answer["help"], "kspout --help lists the demo"
    assert "Usage: kspout status [OPTIONS]" in answer["help"]


def test_the_demo_is_declared_as_an_extension_command() -> None:
    commands = declared()
    assert "demo" in commands, "no kspout.commands entry points: run `pip install -e .` here"
    assert commands["demo"].value == "kspout_demo.command:demo"


def test_kspout_demo_help_still_works() -> None:
    done = subprocess.run([str(KSPOUT), "demo", "--help"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "Produce sentences with injected failures" in done.stdout
    for option in ("--config", "--messages", "--spark", "--dev", "--json"):
        assert option in done.stdout


def test_an_unknown_command_is_still_refused() -> None:
    result = CliRunner().invoke(main, ["nosuch"])
    assert result.exit_code == 2
    assert "No such command 'nosuch'" in result.output
