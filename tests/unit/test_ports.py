"""free_port: a server's port is drawn where no outgoing connection can take it first."""

from __future__ import annotations

import socket

import pytest

from kspout.devstack import ports


def test_ports_are_distinct_bindable_and_outside_the_kernels_ephemeral_range() -> None:
    low, high = (int(field) for field in ports.EPHEMERAL_RANGE.read_text().split())
    picked = [ports.free_port() for _ in range(50)]
    assert len(set(picked)) == len(picked)
    assert all(not low <= port <= high for port in picked)
    with socket.socket() as sock:  # each is free: a server can bind it
        sock.bind((ports.LOOPBACK, picked[-1]))


def test_a_port_something_listens_on_is_not_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as server:
        server.bind((ports.LOOPBACK, ports.free_port()))
        server.listen()
        taken = server.getsockname()[1]
        spare = ports.free_port()  # free now; not `taken + 1`, which an earlier test may hold
        ports._handed_out.difference_update({taken, spare})  # as if another process picked them
        monkeypatch.setattr(ports, "_outside_ephemeral_range", lambda: [taken, spare])
        assert ports.free_port() == spare
