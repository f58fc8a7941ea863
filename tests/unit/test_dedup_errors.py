"""dedup's errors: one root, and each error under exactly one of the caller's next moves."""

from __future__ import annotations

import inspect

import dedup.errors
from dedup.errors import (
    DedupError,
    EffectNotAllowed,
    FencedOut,
    FixSetup,
    GiveUp,
    HandlerFailed,
    NotDurable,
    PostgresUnavailable,
    RetryLater,
)
from kspout.errors import KspoutError

MOVES = (RetryLater, FixSetup, GiveUp)


def test_every_error_is_under_exactly_one_next_move() -> None:
    errors = [
        cls
        for _, cls in inspect.getmembers(dedup.errors, inspect.isclass)
        if issubclass(cls, DedupError) and cls not in (DedupError, *MOVES)
    ]
    assert len(errors) == 14
    for cls in errors:
        assert sum(issubclass(cls, move) for move in MOVES) == 1, cls


def test_the_moves_match_what_the_errors_say() -> None:
    assert issubclass(NotDurable, RetryLater)  # "its messages are offered again"
    assert issubclass(HandlerFailed, RetryLater)  # "the batch runs again"
    assert issubclass(EffectNotAllowed, FixSetup) and issubclass(EffectNotAllowed, ValueError)
    assert issubclass(FencedOut, GiveUp)  # "never retry the write"
    assert issubclass(PostgresUnavailable, KspoutError)  # the CLI reports it as its own


def test_the_package_root_exports_the_root_and_the_moves() -> None:
    import dedup

    assert {"DedupError", "RetryLater", "FixSetup", "GiveUp"} <= set(dedup.__all__)
    assert dedup.RetryLater is RetryLater
