"""Settings every queued exporter shares (exporterhelper in the Collector): retry and the sending queue."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from otel_llm.confmap import ConfigError, Duration, PositiveInt


@dataclass(frozen=True)
class RetryOnFailure:
    enabled: bool = True
    initial_interval: Duration = 1.0
    max_interval: Duration = 30.0
    max_elapsed_time: Duration = 300.0  # 0 = retry forever
    multiplier: float = 1.5

    BOUNDS: ClassVar[dict[str, tuple[float, float]]] = {
        "initial_interval": (0.001, 3600.0),  # 0 would retry in a busy loop
        "max_interval": (0.001, 86400.0),
        "max_elapsed_time": (0.0, 7 * 86400.0),
        "multiplier": (1.0, 100.0),
    }

    def validate(self, path: str) -> None:
        if self.multiplier < 1:
            raise ConfigError(f"{path}.multiplier", "must be >= 1")
        if self.initial_interval > self.max_interval:
            raise ConfigError(f"{path}.initial_interval", "must not exceed max_interval")


@dataclass(frozen=True)
class SendingQueue:
    enabled: bool = True
    num_consumers: PositiveInt = 2
    queue_size: PositiveInt = 1000  # export requests (batches of kept spans) held in memory
    storage: str = ""  # a directory: the queue is also written there and replayed after a restart
    batch_max_spans: PositiveInt = 2048  # kept traces are batched into requests of about this many spans
    batch_timeout: Duration = 0.2  # ... or sent after this long, whichever comes first

    BOUNDS: ClassVar[dict[str, tuple[float, float]]] = {
        "num_consumers": (1, 1024),  # one thread each
        "queue_size": (1, 10_000_000),
        "batch_max_spans": (1, 10_000_000),
        "batch_timeout": (0.0, 600.0),
    }
