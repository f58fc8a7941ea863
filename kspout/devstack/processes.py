"""Server processes of the dev stack: spawn detached with a log file, wait until ready, stop.

Stopping works from a bare pid, because `kspout dev down` runs in a later shell than the
`kspout dev up` that started the servers. Each server leads its own session (and process group),
so a Ctrl-C in the terminal does not reach it and a stop reaches its children too.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from kspout.errors import StackError

GRACE = 10.0  # seconds a server gets to shut down cleanly after SIGTERM (Redis fsyncs its AOF)
KILL_WAIT = 10.0  # seconds to wait for the kernel to remove a process after SIGKILL
POLL = 0.05  # seconds between checks; servers here start in 0.1-2 s

Clock = Callable[[], float]
Sleep = Callable[[float], None]


def spawn(argv: Sequence[str], log_path: Path, cwd: Path) -> subprocess.Popen[bytes]:
    """Start `argv` in a new session, stdout and stderr appended to `log_path`."""
    with log_path.open("ab") as log:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            start_new_session=True,
        )


def log_tail(log_path: Path, lines: int = 20) -> str:
    """The last `lines` lines of a log, for error messages ("" if there is no log)."""
    try:
        with log_path.open("rb") as log:
            log.seek(0, os.SEEK_END)
            log.seek(max(0, log.tell() - 8192))
            text = log.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def wait_ready(
    process: subprocess.Popen[bytes],
    ready: Callable[[], bool],
    *,
    what: str,
    log_path: Path,
    timeout: float,
    clock: Clock = time.monotonic,
    sleep: Sleep = time.sleep,
) -> None:
    """Poll `ready()` until it is true; `StackError` with the log's tail if the process exits
    first or `timeout` seconds pass."""
    deadline = clock() + timeout
    while not ready():
        code = process.poll()
        if code is not None:
            problem = f"{what} exited with code {code} while starting"
        elif clock() >= deadline:
            problem = f"{what} did not answer within {timeout:.0f} s"
        else:
            sleep(POLL)
            continue
        raise StackError(f"{problem}; last lines of {log_path}:\n{log_tail(log_path)}")


def start_time(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot, from /proc), to tell a reused pid from
    the process we started; None where /proc is not available."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Fields after the parenthesised command name start at field 3; starttime is field 22.
    return int(stat.rpartition(")")[2].split()[19])


def pid_alive(pid: int, started: int | None = None) -> bool:
    """True if `pid` runs (not a zombie) and, when `started` is given and /proc tells, is the
    process that started at that time."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reap it if it is our own child that exited
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by another user
    with contextlib.suppress(OSError):
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        if state == "Z":
            return False
    now = start_time(pid)
    return started is None or now is None or now == started


def stop_pid(
    pid: int, grace: float = GRACE, *, clock: Clock = time.monotonic, sleep: Sleep = time.sleep
) -> None:
    """SIGTERM the process group led by `pid`, SIGKILL it after `grace` seconds, and return once
    the process is gone. `grace=0` kills at once."""
    steps = [(signal.SIGTERM, grace)] if grace > 0 else []
    steps.append((signal.SIGKILL, KILL_WAIT))
    for sig, wait in steps:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, sig)
        if _wait_gone(pid, clock() + wait, clock, sleep):
            return
    raise StackError(f"process {pid} is still alive {KILL_WAIT:.0f} s after SIGKILL")


def _wait_gone(pid: int, deadline: float, clock: Clock, sleep: Sleep) -> bool:
    """Wait until `pid` is gone or `deadline` passes; True if it is gone."""
    while pid_alive(pid):
        if clock() >= deadline:
            return False
        sleep(POLL)
    return True
