"""``telemetry.incrementer``: the per-trace chain's counter increments, exact however many threads
increment and whichever value (the core's lock-free one or prometheus_client's) holds the count."""

from __future__ import annotations

import sys
import threading

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest

from otel_llm.internal import core as native_core
from otel_llm.service.telemetry import incrementer

THREADS, PER_THREAD = 4, 20_000


def _exposition(registry: CollectorRegistry) -> list[str]:
    return [line for line in generate_latest(registry).decode().splitlines() if "_created" not in line]


@pytest.mark.parametrize("labelled", [True, False])
def test_increments_from_threads_are_all_counted(labelled: bool) -> None:
    """Four threads each take the child's increment (the first swaps the value, racing the others)
    and count 20 000 times, switching threads every 10 µs: the exposition shows every one, as a
    counter prometheus_client counts itself shows the same total."""
    registry, reference_registry = CollectorRegistry(), CollectorRegistry()
    labels = ["reason"] if labelled else []
    counter = Counter("otel_llm_test_things", "Things.", labels, registry=registry)
    reference = Counter("otel_llm_test_things", "Things.", labels, registry=reference_registry)
    child = counter.labels("ready") if labelled else counter
    reference_child = reference.labels("ready") if labelled else reference
    child.inc(3)  # counted before the swap: kept by it
    start = threading.Barrier(THREADS)

    def count() -> None:
        start.wait()
        inc = incrementer(child)
        for _ in range(PER_THREAD):
            inc(1)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        threads = [threading.Thread(target=count) for _ in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    reference_child.inc(3 + THREADS * PER_THREAD)
    assert _exposition(registry) == _exposition(reference_registry)
    suffix = '{reason="ready"}' if labelled else ""
    assert f"otel_llm_test_things_total{suffix} {3.0 + THREADS * PER_THREAD}" in _exposition(registry)
    extension = native_core.active()[0]
    expected = "MutexValue" if extension is None else "CounterValue"
    assert type(child._value).__name__ == expected
    child.inc(2)  # the counter's own inc still counts into the same value
    assert child._value.get() == 5.0 + THREADS * PER_THREAD
