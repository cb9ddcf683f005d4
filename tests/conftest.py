from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.support.otelllm import RunningServer, start_server


@pytest.fixture
def make_server(tmp_path) -> Iterator[Callable[..., RunningServer]]:
    servers: list[RunningServer] = []

    def make(overrides: dict[str, Any] | None = None) -> RunningServer:
        server = start_server(str(tmp_path / f"store{len(servers)}"), overrides)
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


@pytest.fixture
def server(make_server) -> RunningServer:
    return make_server()
