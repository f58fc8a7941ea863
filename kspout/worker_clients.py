"""This process's clients, one per key, made on first use and kept for the process's life.

Clients do not pickle: what travels to a Spark Python worker is settings, and the worker makes
its clients on first use; every later task it runs reuses them. Every cache here is keyed the
same way, by `client_key` of the arguments its maker takes: a topic config counts with every
setting it holds (secrets included), a mapping by its sorted items, and the process id joins
the key, so a forked child never writes to its parent's sockets. A maker gets exactly what
keyed it, so no setting it reads can be missing from the key.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Hashable, Mapping
from typing import Generic, TypeVar

from pydantic import BaseModel, SecretStr

V = TypeVar("V")


def client_key(*args: object) -> Hashable:
    """`args` in a hashable form in which equal settings are equal keys."""
    return tuple(_frozen(arg) for arg in args)


def _frozen(value: object) -> Hashable:
    if isinstance(value, BaseModel):
        fields = type(value).model_fields
        return (type(value).__name__, *((name, _frozen(getattr(value, name))) for name in fields))
    if isinstance(value, SecretStr):
        return ("secret", value.get_secret_value())
    if isinstance(value, Mapping):
        return tuple(sorted((key, _frozen(item)) for key, item in value.items()))
    if isinstance(value, list | tuple):
        return tuple(_frozen(item) for item in value)
    assert isinstance(value, Hashable), f"{value!r} cannot be part of a client key"
    return value


class WorkerClients(Generic[V]):
    """`get(*args)`: the client `make(*args)` made in this process (or, with `per_thread`,
    this thread) for equal arguments, made now if there is none or `usable` refuses it."""

    def __init__(
        self,
        make: Callable[..., V],
        *,
        usable: Callable[[V], bool] | None = None,
        per_thread: bool = False,
    ) -> None:
        self._make = make
        self._usable = usable
        self._shared: dict[Hashable, V] = {}
        self._local = threading.local() if per_thread else None

    def _clients(self) -> dict[Hashable, V]:
        if self._local is None:
            return self._shared
        clients: dict[Hashable, V] | None = getattr(self._local, "clients", None)
        if clients is None:
            clients = self._local.clients = {}
        return clients

    def get(self, *args: object) -> V:
        clients = self._clients()
        key = (os.getpid(), client_key(*args))
        client = clients.get(key)
        if client is None or (self._usable is not None and not self._usable(client)):
            client = clients[key] = self._make(*args)
        return client

    def pop(self, *args: object) -> V | None:
        """Forget the client `get(*args)` would return (the caller closes it), if any."""
        return self._clients().pop((os.getpid(), client_key(*args)), None)

    def close_all(self, close: Callable[[V], None]) -> None:
        """Forget every client made in this process (this thread, with `per_thread`) and
        `close` each."""
        clients = self._clients()
        while clients:
            _, client = clients.popitem()
            close(client)
