"""Loopback ports: pick a free one for a server, and check whether something answers on one."""

from __future__ import annotations

import random
import socket
from pathlib import Path

LOOPBACK = "127.0.0.1"

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 10_000  # below this, ports that well-known services may claim
HIGHEST = 65_535
TRIES = 200

_handed_out: set[int] = set()  # ports this process gave a server: never given twice


def free_port(host: str = LOOPBACK) -> int:
    """A port nobody listens on now, for a server this process is about to start.

    The port is released before the server binds it. The kernel's own pick (port 0) comes from
    its ephemeral range, which is also where every outgoing connection takes its local port: a
    busy machine could take the port in between, and the server would fail to start ("Address
    already in use", as a three-node Kafka cluster did in CI while its nodes formatted). So the
    port is drawn outside that range, where only a server binding that very number could take
    it, and never handed out twice by this process.
    """
    candidates = _outside_ephemeral_range()
    for _ in range(TRIES):
        port = random.choice(candidates)
        if port not in _handed_out and _bindable(host, port):
            _handed_out.add(port)
            return port
    port = _kernel_pick(host)  # the range is crowded: fall back to the kernel's pick
    _handed_out.add(port)
    return port


def _outside_ephemeral_range() -> range:
    """The ports at or above LOWEST that the kernel never picks for port 0 or a connection."""
    try:
        low, high = (int(field) for field in EPHEMERAL_RANGE.read_text().split())
    except (OSError, ValueError):  # not Linux: the usual range of other systems (IANA's)
        low, high = 49_152, HIGHEST
    below, above = range(LOWEST, low), range(high + 1, HIGHEST + 1)
    return below if len(below) >= len(above) else above


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def _kernel_pick(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    """True if a TCP connection to `host:port` succeeds within `timeout` seconds."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False
