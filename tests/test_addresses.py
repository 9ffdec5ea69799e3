"""Addresses as the user writes them: worker endpoints (host:port) and which hosts are loopback."""

from __future__ import annotations

import pytest

from app.addresses import is_loopback, parse_endpoint, parse_endpoints


def test_worker_addresses_are_host_port_in_order_each_once() -> None:
    got = parse_endpoints(" 10.0.0.2:50052, [::1]:7000 ,10.0.0.2:50052,localhost:1")
    assert [str(e) for e in got] == ["10.0.0.2:50052", "[::1]:7000", "localhost:1"]
    assert [e.loopback for e in got] == [False, True, True]
    assert parse_endpoints("") == []
    for bad, said in (("nohost", "not host:port"), ("h:0", "not host:port"), ("::1:50052", "brackets")):
        with pytest.raises(ValueError, match=said):
            parse_endpoint(bad)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("localhost", True),
        ("LocalHost.", True),
        ("127.0.0.1", True),
        ("127.3.2.1", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.168.1.20", False),
        ("localhost.example.com", False),
        ("", False),
    ],
)
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback
