"""Free loopback ports for the services tests start, so two copies of the suite (or a copy and a
daemon left by a killed run) never fight over a fixed port.

A port is free when it was checked, not reserved: the service must bind it soon after. The kernel
hands out ephemeral ports in a rotating, randomised order, so two copies asking at the same time
get different ones.
"""

from __future__ import annotations

import random
import socket
from contextlib import ExitStack

# Below Linux's default ephemeral range (32768-60999), so a block never collides with the ports
# the kernel gives to outgoing connections and to `free_port`.
_BLOCK_RANGE = (20000, 32000)


def free_ports(count: int) -> list[int]:
    """`count` different free ports on 127.0.0.1 (all held open until all are chosen)."""
    with ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]


def free_port() -> int:
    """One free port on 127.0.0.1."""
    return free_ports(1)[0]


def free_port_block(count: int) -> int:
    """A base port with `count` consecutive free ports from it, for commands that take a port
    range. The search starts at random, so concurrent copies of the suite pick different blocks."""
    low, high = _BLOCK_RANGE
    for _ in range(200):
        base = random.randrange(low, high - count)
        try:
            with ExitStack() as stack:
                for port in range(base, base + count):
                    stack.enter_context(socket.socket()).bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError(f"no {count} consecutive free ports in {low}-{high}")
