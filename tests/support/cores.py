"""Which implementation of the hot path a test runs: the compiled core or the Python reference."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from otel_llm.internal import core as native_core


@contextlib.contextmanager
def implementation(name: str) -> Iterator[None]:
    """``OTEL_LLM_CORE=name`` for what this process makes meanwhile (``native_core.active()``)."""
    saved = native_core._selected
    native_core._selected = native_core.select(name)
    try:
        yield
    finally:
        native_core._selected = saved
