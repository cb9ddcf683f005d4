"""TGI records its timings as Rust ``Duration`` Debug text (``format!("{:?}", d)``)."""

from __future__ import annotations

import re

_UNIT_SECONDS = {"s": 1.0, "ms": 1e-3, "µs": 1e-6, "us": 1e-6, "μs": 1e-6, "ns": 1e-9}
_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(s|ms|µs|μs|us|ns)\s*$")


def parse_rust_duration(text: str) -> float:
    """``"1.234567ms"`` -> 0.001234567 seconds. Raises ``ValueError`` on anything else."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"not a Rust Duration: {text[:40]!r}")
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
