"""The test's own ledger, to judge a `kspout run` without taking kspout's records for it.

What was produced is the test's own list (`produced`: each message's value names its partition
and offset). What was handled to completion is a file the handler (`LEDGER_HANDLER`) appends a
line to only after its work succeeded, in one `write` to an `O_APPEND` file, fsynced before the
handler returns (so before kspout can ack the message): a message in the ledger was processed,
whatever kspout recorded, and one that raised is not in it. A SIGKILL cannot leave half a line
(one small write); `finished` still drops a last line without its newline.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from tests.integration.helpers import value_of

LEDGER_HANDLER = """\
import os, time

LEDGER = os.open(os.environ["LEDGER"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
PAUSE = float(os.environ.get("HANDLER_PAUSE", "0"))
FAIL_EVERY = int(os.environ.get("FAIL_EVERY", "0"))


def handle(record):
    time.sleep(PAUSE)  # the work
    if FAIL_EVERY and record.offset % FAIL_EVERY == FAIL_EVERY - 1:
        raise RuntimeError("failing message")
    os.write(LEDGER, b"%s %.6f\\n" % (record.value, time.monotonic()))  # after success only
    os.fsync(LEDGER)
"""

HANDLER_NAME = "ledger_handler:handle"  # `--handler`, with LEDGER_HANDLER in the cwd


def write_handler(directory: Path) -> str:
    """Write LEDGER_HANDLER into `directory` (a run's cwd); its `--handler` argument."""
    (directory / "ledger_handler.py").write_text(LEDGER_HANDLER)
    return HANDLER_NAME


def produced(per_partition: Mapping[int, range]) -> set[bytes]:
    """The values the test produced (`helpers.produce` with its default values)."""
    return {value_of(p, o) for p, offsets in per_partition.items() for o in offsets}


def entries(ledger: Path) -> list[tuple[bytes, float]]:
    """Each line of the ledger: a value, and when it finished (`time.monotonic()`, one clock
    for every process of the machine)."""
    if not ledger.exists():
        return []
    *complete, _partial = ledger.read_bytes().split(b"\n")
    return [(value, float(at)) for value, at in (line.split() for line in complete)]


def finished(ledger: Path) -> dict[bytes, float]:
    """Each value in the ledger, with when it first finished."""
    out: dict[bytes, float] = {}
    for value, at in entries(ledger):
        out.setdefault(value, at)
    return out
