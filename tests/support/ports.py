"""Free TCP ports for servers the tests start on loopback."""

from __future__ import annotations

import random
import socket


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now, below the kernel's ephemeral range.

    Another process could take it before the caller binds; tests use it only where the port must
    be known in advance (a config file, a backend started later), and bind to port 0 otherwise.
    Below the ephemeral range no outgoing connection is ever given it: a client that connects to a
    port before its server listens (an exporter retrying a backend started later) could otherwise
    be handed that very port as its own source port, connect to itself, and hold it ("Address
    already in use" for the server, seen once in a full run)."""
    low = _ephemeral_low()
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(10_000, max(10_001, low))
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
