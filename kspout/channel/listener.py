"""Driver side of the outcome channel: accepts task connections and queues their messages.

A `multiprocessing.connection.Listener` with a random key: the key travels to executors inside
each job (as Spark ships the job's closures), and every connection must prove it knows the key
(an HMAC challenge, both ways) before anything it sends is read. One thread accepts; each
connection (one per Python worker) gets a thread of its own that runs the challenge and then
reads, so a peer that connects and never answers holds up nobody else. The driver loop drains
the queue; nothing here touches the driver's state.
"""

from __future__ import annotations

import logging
import queue
import secrets
import threading
from multiprocessing import AuthenticationError
from multiprocessing.connection import (
    Connection,
    Listener,
    answer_challenge,
    deliver_challenge,
)

from kspout.contract import ChannelAddress, Message
from kspout.lifecycle import Lifecycle

log = logging.getLogger(__name__)


class OutcomeChannel(Lifecycle):
    """Listens on `host` (port chosen by the OS) for beats and final results from tasks."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self._host = host
        self._listener: Listener | None = None
        self._queue: queue.SimpleQueue[Message] = queue.SimpleQueue()
        self._connections: list[Connection] = []
        self._authkey = b""
        self._lock = threading.Lock()
        self.address: ChannelAddress | None = None

    def start(self) -> None:
        if self._listener is not None:
            return
        self._authkey = secrets.token_bytes(32)
        self._listener = Listener((self._host, 0))  # the challenge runs per connection
        host, port = self._listener.address
        self.address = ChannelAddress(host, port, self._authkey)
        threading.Thread(target=self._accept, name="kspout-channel", daemon=True).start()

    def close(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        with self._lock:
            for conn in self._connections:
                conn.close()
            self._connections.clear()

    def drain(self) -> list[Message]:
        """Everything received since the last call, in arrival order; never blocks."""
        out: list[Message] = []
        while True:
            try:
                out.append(self._queue.get_nowait())
            except queue.Empty:
                return out

    def _accept(self) -> None:
        while self._listener is not None:
            try:
                conn = self._listener.accept()
            except Exception as exc:  # closed, or a peer that failed the challenge
                if self._listener is None:
                    return
                log.debug("outcome channel: refused a connection: %s", exc)
                continue
            with self._lock:
                self._connections.append(conn)
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: Connection) -> None:
        try:
            deliver_challenge(conn, self._authkey)
            answer_challenge(conn, self._authkey)
            while True:
                self._queue.put(conn.recv())
        except AuthenticationError as exc:
            log.warning("outcome channel: refused a connection: %s", exc)
        except Exception:  # the peer hung up, or close() closed the connection under us
            pass
        finally:
            with self._lock:
                if conn in self._connections:
                    self._connections.remove(conn)
            conn.close()
