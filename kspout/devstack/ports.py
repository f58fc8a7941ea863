"""Loopback ports: pick a free one, and check whether something answers on one."""

from __future__ import annotations

import socket

LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    """A port nobody listens on right now (the kernel's pick for port 0).

    The port is released before a server binds it, so another process could take it in between;
    on a development machine that race is rare enough, and the server's start fails loudly if so.
    """
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
