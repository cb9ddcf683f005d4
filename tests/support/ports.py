"""Free TCP ports for servers the tests start on loopback."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now (bind to port 0, then release it).

    Another process could take it before the caller binds; tests use it only where the port must
    be known in advance (a config file, a backend started later), and bind to port 0 otherwise."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
