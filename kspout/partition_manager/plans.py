"""What `plan` hands out: spans of offsets to fetch, each at its attempt, under one generation."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass

from kspout.ranges import Range, append


@dataclass(frozen=True, slots=True)
class Span:
    """A planned run of offsets `[start, end)`, all at the same attempt."""

    start: int
    end: int
    attempt: int


@dataclass(frozen=True, slots=True)
class Plan:
    """Offsets to fetch next: due retries and a new range, ascending, each offset once."""

    spans: tuple[Span, ...]
    generation: int  # outcomes from another generation (before an out-of-range reset) are ignored

    def __iter__(self) -> Iterator[int]:
        for span in self.spans:
            yield from range(span.start, span.end)

    def __len__(self) -> int:
        return sum(span.end - span.start for span in self.spans)

    def __bool__(self) -> bool:
        return bool(self.spans)

    def ranges(self) -> list[Range]:
        """Half-open ranges to fetch; adjacent spans of different attempts are joined."""
        out: list[Range] = []
        for span in self.spans:
            append(out, span.start, span.end)
        return out

    def attempt_of(self, offset: int) -> int:
        """The attempt number this plan gives `offset` (KeyError when not planned)."""
        i = bisect_right(self.spans, offset, key=lambda span: span.start) - 1
        if i < 0 or offset >= self.spans[i].end:
            raise KeyError(offset)
        return self.spans[i].attempt


def join(spans: list[Span]) -> list[Span]:
    """`spans` (ascending) with neighbours at the same attempt joined."""
    out: list[Span] = []
    for span in spans:
        if out and out[-1].end == span.start and out[-1].attempt == span.attempt:
            out[-1] = Span(out[-1].start, span.end, span.attempt)
        else:
            out.append(span)
    return out
