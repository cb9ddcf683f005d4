"""``processors.memory_limiter``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from otel_llm.confmap import ConfigError, Duration


@dataclass(frozen=True)
class MemoryLimiterProcessor:
    """As the Collector's memory_limiter: refuse data (retryably) above ``limit - spike`` RSS."""

    check_interval: Duration = 1.0
    limit_mib: int = 0  # 0: limit_percentage of the cgroup limit or of physical memory
    spike_limit_mib: int = 0  # 0: 20 % of the limit
    limit_percentage: float = 80.0

    BOUNDS: ClassVar[dict[str, tuple[float, float]]] = {
        "check_interval": (0.01, 600.0),  # 0 is a busy loop
        "limit_mib": (0, 1 << 22),  # 4 TiB; in bytes into a shared int64
        "spike_limit_mib": (0, 1 << 22),
    }

    def validate(self, path: str) -> None:
        if self.limit_mib < 0 or self.spike_limit_mib < 0:
            raise ConfigError(path, "limits must not be negative")
        if self.limit_mib and self.spike_limit_mib >= self.limit_mib:
            raise ConfigError(f"{path}.spike_limit_mib", "must be below limit_mib")
        if not 0 < self.limit_percentage <= 100:
            raise ConfigError(f"{path}.limit_percentage", "must be in (0, 100]")
