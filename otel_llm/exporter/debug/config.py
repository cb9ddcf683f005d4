"""``exporters.debug``: each kept trace's summary in otel-llm's log, as the Collector's debug exporter."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from otel_llm.confmap import ConfigError

VERBOSITIES = ("basic", "normal", "detailed")


@dataclass(frozen=True)
class DebugExporter:
    # basic: one line per kept trace; normal: and one per request in it; detailed: and one per span.
    verbosity: str = "basic"
    # Per second, the first ``sampling_initial`` kept traces are logged, then every ``sampling_thereafter``-th.
    sampling_initial: int = 2
    sampling_thereafter: int = 1

    BOUNDS: ClassVar[dict[str, tuple[float, float]]] = {
        "sampling_initial": (0, 1_000_000),
        "sampling_thereafter": (1, 1_000_000),
    }

    def validate(self, path: str) -> None:
        if self.verbosity not in VERBOSITIES:
            raise ConfigError(f"{path}.verbosity", f"expected one of {', '.join(VERBOSITIES)}, got {self.verbosity!r}")
