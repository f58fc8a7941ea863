"""The `kspout` fields of an offset record: finished runs, their cap, the window history, and
what a replay would reach past the window. Pure logic: records are decoded from bytes, no
ZooKeeper involved (tests/integration/test_offsets.py has the real server)."""

from __future__ import annotations

import json
import logging
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kspout.config import TopicConfig, parse_config
from kspout.zk import record as records
from kspout.zk.record import (
    HISTORY_MAX,
    HISTORY_STEP,
    MAX_DONE_SPANS,
    Checkpoint,
    StoredOffset,
    encode_done,
    history_fields,
    next_history,
)

CONFIG: TopicConfig = parse_config({"topic": "orders", "spout_id": "s"})
PATH = "/kspout/s/partition_0"
WINDOW = 100.0  # seconds
HOUR_MS = 3_600_000


def decode(offset: int, **ours: Any) -> StoredOffset:
    record = {"offset": offset, "partition": 0, "topic": "orders", "kspout": ours}
    return records.decode(0, PATH, json.dumps(record).encode(), 3, CONFIG.topic)


@st.composite
def runs(draw: st.DrawFn, start: int) -> list[tuple[int, int]]:
    """Ascending, disjoint, non-adjacent runs above `start` (as a PartitionManager has them)."""
    out: list[tuple[int, int]] = []
    at = start
    for _ in range(draw(st.integers(0, 2 * MAX_DONE_SPANS // 3))):
        lo = at + draw(st.integers(1, 10**6))
        out.append((lo, lo + draw(st.integers(1, 10**6))))
        at = out[-1][1]
    return out


@given(st.data(), st.integers(0, 10**12))
def test_finished_runs_round_trip(data: st.DataObject, offset: int) -> None:
    spans = data.draw(runs(offset))
    fields = encode_done(offset, spans, None)
    record = decode(offset, **fields)
    assert list(record.done) == spans
    assert record.done_cut is None
    # Compact: two numbers per run, each a gap or a length (not an absolute offset).
    assert len(fields.get("done", [])) == 2 * len(spans)
    assert all(n <= 10**6 for n in fields.get("done", []))


def test_runs_past_the_cap_are_cut_and_named() -> None:
    spans = [(10 * i + 1, 10 * i + 5) for i in range(MAX_DONE_SPANS + 40)]
    fields = encode_done(0, spans, None)
    record = decode(0, **fields)
    assert list(record.done) == spans[:MAX_DONE_SPANS], "the runs nearest the commit point stay"
    assert record.done_cut == spans[MAX_DONE_SPANS][0]
    # A record at the cap stays small, far below ZooKeeper's 1 MB znode limit.
    wide = [(10**9 * i + 1, 10**9 * i + 10**8) for i in range(MAX_DONE_SPANS + 1)]
    assert len(json.dumps(encode_done(0, wide, None))) < 8_000


def test_a_cut_the_manager_reports_is_kept() -> None:
    fields = encode_done(100, [(105, 110)], 130)
    record = decode(100, **fields)
    assert record.done == ((105, 110),) and record.done_cut == 130


@pytest.mark.parametrize(
    "ours",
    [
        {"done": "1,2"},
        {"done": [1, 2, 3]},
        {"done": [1, 0]},
        {"done": [-1, 5]},
        {"done": [1, True]},
        {"done": [1, "5"]},
        {"done": None, "history": "x"},
        {"history": [[1, 2]]},
        {"history": [[1, 2, -3]]},
        {"window": "1 day"},
        {"window": 0},
        {"done_cut": -5, "advanced_at": "now", "emitted": 1.5},
    ],
)
def test_garbage_in_the_fields_is_ignored_with_a_warning(
    ours: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, "kspout.zk.record"):
        record = decode(42, **ours)
    assert record.offset == 42, "the offset still counts"
    assert record.done == () and record.history == ()
    assert record.window is None and record.done_cut is None and record.advanced_at is None
    assert PATH in caplog.text and "ignor" in caplog.text


def test_a_storm_kafka_record_has_no_kspout_fields() -> None:
    raw = json.dumps({"offset": 7, "partition": 0, "topic": "orders"}).encode()
    record = records.decode(0, PATH, raw, 0, CONFIG.topic)
    assert (record.done, record.history, record.window, record.committed_at) == ((), (), None, None)
    assert record.replay_past_window(0, WINDOW, 10**13, keep_done=False) == []


# -- the window history ----------------------------------------------------------------------


def test_history_keeps_a_checkpoint_per_step_and_reaches_just_past_the_window() -> None:
    step = int(WINDOW * 1000 / HISTORY_STEP)
    history: tuple[Checkpoint, ...] = ()
    for i in range(200):  # a write every quarter step, offsets growing
        at = i * step // 4
        history = next_history(history, Checkpoint(at, 10 * i, 10 * i + 5), WINDOW)
    now = 199 * step // 4
    assert len(history) <= HISTORY_MAX
    assert history[0].at_ms <= now - WINDOW * 1000 < history[1].at_ms, "one older than the window"
    gaps = [b.at_ms - a.at_ms for a, b in pairwise(history)]
    assert all(g >= step for g in gaps)


def test_dropped_checkpoints_fold_their_emitted_into_the_oldest_kept() -> None:
    """After an operator moved the offset back, an old checkpoint's `emitted` is larger than a
    newer one's: trimming must not lose it, or the bound would forget offsets finished then."""
    history = (Checkpoint(0, 900, 1000), Checkpoint(60_000, 10, 20))
    trimmed = next_history(history, Checkpoint(250_000, 30, 40), WINDOW)
    assert [c.at_ms for c in trimmed] == [60_000, 250_000]
    assert trimmed[0].emitted == 1000


def record_with_history(
    offset: int, history: list[Checkpoint], committed_at: int, **ours: Any
) -> StoredOffset:
    return decode(offset, committed_at=committed_at, **history_fields(history, WINDOW), **ours)


def test_a_move_back_past_offsets_finished_before_the_window_is_reported() -> None:
    # Commit points: 100 at hour 0, 500 at hour 1, 900 at hour 2 (the record itself).
    history = [Checkpoint(0, 100, 150), Checkpoint(HOUR_MS, 500, 560)]
    record = record_with_history(900, history, 2 * HOUR_MS, emitted=950)
    now = 2 * HOUR_MS + 1000
    window = HOUR_MS / 1000 * 1.5  # the window began at hour 0.5
    assert record.replay_past_window(0, window, now, keep_done=False) == [(0, 560)]
    assert record.replay_past_window(600, window, now, keep_done=False) == []
    assert record.passed_at(0) == 0 and record.passed_at(300) == HOUR_MS
    # A restart at the stored offset replays nothing finished.
    assert record.replay_past_window(900, window, now, keep_done=True) == []


def test_finished_runs_above_a_long_stuck_commit_point() -> None:
    """The commit point stuck at 100 for two hours, runs above it finished meanwhile: a restart
    skips the listed runs, a move drops them, and runs the cap left out always replay."""
    history = [Checkpoint(0, 100, 400), Checkpoint(HOUR_MS, 100, 800)]
    done = encode_done(100, [(101, 300), (310, 700)], 750)
    record = record_with_history(100, history, 2 * HOUR_MS, emitted=900, **done)
    window, now = 5400.0, 2 * HOUR_MS
    # The window began at hour 0.5: offsets from 800 had not started by hour 1.
    assert record.replay_past_window(100, window, now, keep_done=True) == [(750, 800)]
    moved = record.replay_past_window(100, window, now, keep_done=False)
    assert moved == [(101, 300), (310, 700), (750, 800)]
    # A window that began before the first checkpoint: nothing from 400 had started then.
    assert record.replay_past_window(100, 3 * 3600.0, now, keep_done=False) == [
        (101, 300),
        (310, 400),
    ]
