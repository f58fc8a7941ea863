"""README's "First ten minutes", run as printed: the shell blocks between its
`<!-- first-ten-minutes -->` markers, one command at a time in a fresh folder, against the dev
stack its own `kspout dev up` starts. Each command must exit 0 and print what the walk-through
promises; the stack is stopped at the end even when a step fails."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.integration.helpers import kspout_command

README = Path(__file__).resolve().parents[2] / "README.md"
START, END = "<!-- first-ten-minutes -->", "<!-- /first-ten-minutes -->"
HEREDOC = re.compile(r"<<-?'?(\w+)'?")


def walkthrough(text: str) -> list[str]:
    """The shell commands of the marked passage's ```bash blocks, in order; a heredoc stays
    one command with its body."""
    passage = text.split(START, 1)[1].split(END, 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", passage, flags=re.DOTALL)
    commands: list[str] = []
    for block in blocks:
        lines = iter(block.splitlines())
        for line in lines:
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            heredoc = HEREDOC.search(line)
            if heredoc is None:
                commands.append(line)
                continue
            body = list(_until(lines, heredoc.group(1)))
            commands.append("\n".join([line, *body]))
    return commands


def _until(lines: Iterator[str], delimiter: str) -> Iterator[str]:
    for line in lines:
        yield line
        if line == delimiter:
            return


class Shell:
    """Runs one command at a time with bash, as typed, keeping the working directory between
    them (a `cd` carries over), with `kspout` on PATH and no KSPOUT_* variable set."""

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd
        self._where = cwd / ".cwd-after"
        env = {k: v for k, v in os.environ.items() if not k.startswith("KSPOUT_")}
        env["PATH"] = os.pathsep.join([str(kspout_command().parent), env.get("PATH", "")])
        self.env = env

    def __call__(self, command: str) -> subprocess.CompletedProcess[str]:
        script = f'{command}\nstatus=$?\npwd > "{self._where}"\nexit $status\n'
        done = subprocess.run(
            ["bash", "-c", script],
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        self.cwd = Path(self._where.read_text().strip())
        return done


def words(text: str) -> str:
    """`text` with every run of whitespace one space: rich wraps titles at the table's width."""
    return " ".join(text.split())


def as_json(shell: Shell, command: str) -> dict[str, Any]:
    """`command --json` (the walk-through's command, for exact figures)."""
    done = shell(command + " --json")
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def test_first_ten_minutes_runs_as_printed(tmp_path: Path) -> None:
    commands = walkthrough(README.read_text())
    kinds = [" ".join(c.split()[:3]) if c.startswith("kspout") else c.split()[0] for c in commands]
    assert kinds == [
        "mkdir",
        "kspout dev up",
        "cat",
        "cat",
        "kspout produce --config",
        "kspout lag --config",
        "kspout run --config",
        "kspout status --config",
        "kspout lag --config",
        "kspout dev down",
    ], "the walk-through changed: update this test's checks with it"

    shell = Shell(tmp_path)
    stack_at: Path | None = None
    lags: list[int] = []
    try:
        for command in commands:
            done = shell(command)
            assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
            assert "Traceback" not in done.stderr, done.stderr
            if command == "kspout dev up":
                stack_at = shell.cwd
                assert done.stdout.startswith("export KSPOUT_BROKERS=127.0.0.1:"), done.stdout
            elif command.startswith("cat > "):
                assert (shell.cwd / command.split()[2]).is_file()
            elif command.startswith("kspout produce"):
                assert "hello: 100 messages written" in words(done.stdout), done.stdout
            elif command.startswith("kspout lag"):
                lags.append(as_json(shell, command)["lag"])
            elif command.startswith("kspout run"):
                handled = re.findall(r"partition \d offset \d+: (msg-\d{6})", done.stdout)
                assert sorted(handled) == [f"msg-{n:06d}" for n in range(1, 101)]
                assert "hello: final" in words(done.stdout)
            elif command.startswith("kspout status"):
                report = as_json(shell, command)
                assert report["totals"]["partitions"] == 4 and report["totals"]["lag"] == 0
                assert all(row["committed"] == row["high"] for row in report["partitions"])
            elif command == "kspout dev down":
                stack_at = None
                assert "stopped" in done.stderr
        assert lags == [100, 0]
        assert not (shell.cwd / ".kspout-dev").exists()
    finally:
        if stack_at is not None:  # a step failed: stop what `kspout dev up` left running
            subprocess.run(
                ["bash", "-c", "kspout dev down"],
                cwd=stack_at,
                env=shell.env,
                capture_output=True,
                timeout=60,
            )
