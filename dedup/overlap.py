"""A batch leased and settled in parts, Redis's work overlapping the caller's.

A client that waits for each call takes turns with Redis: its own Python for a part (the
handlers, building the settlement), then Redis's scripts, then its own again. Here part k+1's
lease is written before part k's handlers run, and part k's settlement is read only once part
k+1's has been written, so with a core each the two work at once and a client's rate is bound
by the slower of them rather than by their sum (`bench.bench_dedup`: lease + settle, serial
and overlapped).

Every part leases under its own owner, `<owner>/<k>`, so a message that is twice in a batch is
never renewed from under its earlier copy's lease: its later copy finds that lease live and is
DEFERRED, as a repeat within one call is (the next part is leased before this one settles), or
finds it settled: DONE, a DUPLICATE; FAILED, run again as its next attempt.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from dedup.records import LeaseRun, Settlement, SettleResult
from dedup.store import IdempotencyStore, Sent

IDS_PER_CALL = 500  # ids a lease or settle call carries: 500 to 1,000 overlap best in bench_dedup

Ran = TypeVar("Ran")  # what the caller keeps of a part between its handlers and its settlement


def overlapped(
    store: IdempotencyStore,
    ids: Sequence[str],
    partitions: Sequence[int],
    owner: str,
    work: Callable[[int, list[LeaseRun]], tuple[list[Settlement], int | Sequence[int], Ran]],
    answer: Callable[[Sent[list[SettleResult]], Ran], None],
) -> None:
    """Lease `ids` (of `partitions`, one per id) in parts; for each, `work(start, runs)` runs the
    leased ids (`runs` start from the part's first id, at `start` in `ids`) and returns their
    settlements, their partitions (one for all, or one each) and what `answer` needs;
    `answer(sent, ran)` reads the part's settlement with `sent.result()`. Each comes in part
    order, a part's `answer` after the next part's `work`.

    If anything raises, the calls not read are dropped: the leases written for parts that did not
    run expire, and their messages, not acked, are leased again by a replay.
    """
    starts = range(0, len(ids), IDS_PER_CALL)
    written: list[Sent[list[LeaseRun]] | Sent[list[SettleResult]]] = []

    def lease(k: int) -> Sent[list[LeaseRun]]:
        part = slice(starts[k], starts[k] + IDS_PER_CALL)
        sent = store.send_lease(ids[part], f"{owner}/{k}", partitions[part])
        written.append(sent)
        return sent

    try:
        leasing = lease(0) if starts else None
        settling: tuple[Sent[list[SettleResult]], Ran] | None = None
        for k, start in enumerate(starts):
            assert leasing is not None
            runs = leasing.result()
            leasing = lease(k + 1) if k + 1 < len(starts) else None
            settlements, settled_partitions, ran = work(start, runs)
            sent = store.send_settle(settlements, settled_partitions)
            written.append(sent)
            if settling is not None:
                answer(*settling)
            settling = sent, ran
        if settling is not None:
            answer(*settling)
    finally:
        for call in written:
            call.discard()  # a no-op once read
