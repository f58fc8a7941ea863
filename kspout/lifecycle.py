"""The start/close shape shared by kspout's clients, the driver and the dev stack."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class Lifecycle:
    """Something connected by `start()` and released by `close()`; `with` does both."""

    def start(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
