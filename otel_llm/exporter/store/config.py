"""``exporters.store``: the embedded SQLite trace store."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from otel_llm.confmap import Duration, PositiveInt


@dataclass(frozen=True)
class StoreExporter:
    path: str = "./otel-llm-data"
    retention: Duration = 86400.0  # kept traces older than this are deleted
    max_size_mib: PositiveInt = 1024  # past this the oldest traces are deleted
    queue_size: PositiveInt = 10_000  # kept traces waiting for the writer
    max_block: Duration = 5.0  # when the queue is full, how long a decision waits before the trace is dropped
    commit_interval: Duration = 0.1  # a kept trace waits at most this for more to share its transaction

    BOUNDS: ClassVar[dict[str, tuple[float, float]]] = {
        "retention": (0.0, 3650 * 86400.0),
        "max_size_mib": (1, 1 << 24),  # 16 TiB
        "queue_size": (1, 10_000_000),
        "max_block": (0.0, 600.0),
        "commit_interval": (0.0, 10.0),
    }
