"""The harness's port picks: never the same port twice, never one something holds, and (where the
kernel leaves room) none the kernel could give an outgoing connection meanwhile."""

from __future__ import annotations

import socket

from harness.processes import net


def test_picks_before_any_bind_never_share_a_port() -> None:
    # Asking the kernel for port 0 and closing the socket can return one port twice in a row; two
    # servers then race for it (a sidecar's API and metrics ports did in CI).
    ports = [net.free_port() for _ in range(500)]
    assert len(set(ports)) == 500


def test_picks_lie_beneath_the_ephemeral_range() -> None:
    low, _high = net._ephemeral_range()
    if low - net._LOWEST < 2000:
        return  # this kernel leaves no room beneath its range: the harness takes the kernel's picks
    ports = [net.free_port() for _ in range(50)]
    assert all(net._LOWEST <= p < min(net._HIGHEST, low) for p in ports), ports


def test_a_port_something_listens_on_is_skipped() -> None:
    picks = net._Ports()
    if not picks.candidates:
        return  # the kernel's picks: it never hands out a port something listens on
    nxt = picks.candidates[(picks.cursor + 1) % len(picks.candidates)]
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", nxt))
        held.listen()
        assert not net.bindable(nxt)
        assert picks.take((0,)) != nxt


def test_a_block_is_free_around_its_base() -> None:
    base = net.free_port_block((-2, 0, 1))
    assert all(net.bindable(base + o) for o in (-2, 0, 1))
    # and none of its ports is handed out again
    assert not {base - 2, base, base + 1} & {net.free_port() for _ in range(200)}
