"""Whose fault a failed Spark job is, by what Spark says about it.

Tasks never raise for failures outside per-message code (they report them), so a job that
fails has lost a task without a word: its Python worker died (a record killed it, or the
machine did), or Spark could not run it at all. The first is a *crash*, ambiguous until the
driver isolates the records the task left open; anything else is the infrastructure's fault
and costs the messages nothing.
"""

from __future__ import annotations

import enum
import re

# What Spark (3.5 / 4.x) reports when a task's Python worker or its executor died under it.
_CRASH = re.compile(
    r"Python worker exited unexpectedly|worker .*crashed|ExecutorLostFailure|"
    r"Connection reset|Broken pipe|EOFException|killed by signal|SIGKILL|OutOfMemory",
    re.IGNORECASE,
)


class JobFailure(enum.Enum):
    """What a failed job means for the offsets its tasks left unsettled."""

    CRASH = "crash"  # a worker died: isolate the open offsets to find the record that did it
    INFRASTRUCTURE = "infrastructure"  # anything else: release them, back off the partition


def classify(error: str) -> JobFailure:
    """Classify a failed job by its error text (the Spark exception, one or more lines)."""
    return JobFailure.CRASH if _CRASH.search(error) else JobFailure.INFRASTRUCTURE
