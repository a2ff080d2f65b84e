"""Ports drawn for the runtime's servers (gpu_runtime/triton.py ``free_port``): never one this process drew or was
given before — a CI run drew Triton's HTTP port equal to the gateway's, which the test had given but not bound yet
(``address already in use``, the serving process never came up)."""

from __future__ import annotations

import gpu_runtime.triton as triton


class Draws:
    """The kernel's bind(0) as a scripted sequence of ports (a stand-in: the real one picks at random)."""

    def __init__(self, ports):
        self.ports = iter(ports)
        self.port = None

    def __call__(self, *args, **kwargs):
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def bind(self, address):
        self.port = next(self.ports)

    def getsockname(self):
        return ("127.0.0.1", self.port)


def test_a_given_or_drawn_port_is_never_drawn_again(monkeypatch):
    monkeypatch.setattr(triton, "_HANDED_OUT", set())
    monkeypatch.setattr(triton.socket, "socket", Draws([52307, 52307, 41000, 41000, 52307, 43000]))
    triton.reserve_port(52307)  # the gateway's port, given on the command line
    assert triton.free_port() == 41000  # Triton's HTTP port: not the gateway's
    assert triton.free_port() == 43000  # its gRPC port: neither


def test_real_draws_are_distinct():
    drawn = [triton.free_port() for _ in range(50)]
    assert len(set(drawn)) == 50
