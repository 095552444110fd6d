"""The harness's port picks: never the same port twice, never one something holds, and (where the
kernel leaves room) none the kernel could give an outgoing connection meanwhile."""

from __future__ import annotations

import socket

import pytest

from harness.processes import net


def test_picks_before_any_bind_never_share_a_port() -> None:
    # Asking the kernel for port 0 and closing the socket can return one port twice in a row; two
    # servers then race for it (a sidecar's API and metrics ports did in CI).
    ports = [net.free_port() for _ in range(500)]
    assert len(set(ports)) == 500


def test_picks_lie_beneath_the_ephemeral_range() -> None:
    low, _high = net._ephemeral_range()
    if low - net._LOWEST < 2000:
        pytest.skip("this kernel leaves no room beneath its ephemeral range: the harness takes its picks")
    ports = [net.free_port() for _ in range(50)]
    assert all(net._LOWEST <= p < min(net._HIGHEST, low) for p in ports), ports


def test_a_port_something_listens_on_is_skipped() -> None:
    picks = net._Ports()
    if not picks.candidates:
        pytest.skip("the kernel's picks: it never hands out a port something listens on")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        # The first candidate from the cursor on that this test can hold (others may be in use).
        for step in range(1, 200):
            index = (picks.cursor + step) % len(picks.candidates)
            try:
                held.bind(("127.0.0.1", picks.candidates[index]))
            except OSError:
                continue
            break
        else:
            pytest.fail("none of 199 candidate ports could be held")
        held.listen()
        port = held.getsockname()[1]
        assert port == picks.candidates[index]
        picks.cursor = index - 1  # the next pick would be the held port
        assert not net.bindable(port)
        assert picks.take((0,)) != port


def test_a_block_is_free_around_its_base() -> None:
    base = net.free_port_block((-2, 0, 1))
    assert all(net.bindable(base + o) for o in (-2, 0, 1))
    # and none of its ports is handed out again
    assert not {base - 2, base, base + 1} & {net.free_port() for _ in range(200)}
