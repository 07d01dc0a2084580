"""The local stack's ports: RSIEVE_LOCAL_PORTS confines them to a range (the suite's
workers each take one of their own, tests/conftest.py)."""

from __future__ import annotations

import socket

import pytest

from rsieve_cli.local import ports as local_ports
from rsieve_cli.local.ports import PORT_RANGE_ENV, free_port, port_range


def test_every_port_comes_from_the_range_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PORT_RANGE_ENV, "12950-12959")
    monkeypatch.setattr(local_ports, "_HANDED_OUT", set())
    with socket.socket() as busy:  # one port of the range is listened on: never handed out
        busy.bind(("127.0.0.1", 12955))
        busy.listen()
        ports = [free_port() for _ in range(9)]
        assert sorted(ports) == [p for p in range(12950, 12960) if p != 12955]
        with pytest.raises(RuntimeError, match="no free port left in RSIEVE_LOCAL_PORTS"):
            free_port()


def test_without_the_range_the_kernel_chooses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PORT_RANGE_ENV, raising=False)
    assert port_range() is None
    low, high = (int(v) for v in open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
    assert low <= free_port() <= high


@pytest.mark.parametrize("spec", ["12000", "a-b", "13000-12000", "0-10", "65000-70000"])
def test_a_malformed_range_is_refused(monkeypatch: pytest.MonkeyPatch, spec: str) -> None:
    monkeypatch.setenv(PORT_RANGE_ENV, spec)
    with pytest.raises(ValueError, match=PORT_RANGE_ENV):
        port_range()
