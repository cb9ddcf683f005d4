"""The SQLite store on its own: hostile values never stop the writer; retention by age and size."""

from __future__ import annotations

import time
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from prometheus_client import CollectorRegistry

from otel_llm.exporter.store.sqlite import StoreReader, TraceStore
from tests.support.payloads import vllm_batch


def make_store(tmp_path: Path, retention_s: float = 3600, max_size_bytes: int = 1 << 30) -> tuple[TraceStore, CollectorRegistry]:
    registry = CollectorRegistry()
    store = TraceStore(tmp_path, retention_s, max_size_bytes, 1000, registry)
    store.start()
    return store, registry


def one_trace(**kwargs) -> ExportTraceServiceRequest:
    return vllm_batch(1, **kwargs)


def test_absurd_values_do_not_stop_the_writer(tmp_path):
    store, registry = make_store(tmp_path)
    try:
        hostile = one_trace(start_ns=2**64 - 10**10)
        span = hostile.resource_spans[0].scope_spans[0].spans[0]
        span.end_time_unix_nano = 2**64 - 1  # uint64 max: no SQLite INTEGER holds it
        kv = span.attributes.add()
        kv.key, kv.value.int_value = "huge", -(2**63)
        normal = one_trace(model="after")
        assert store.submit(hostile, [], "test") and store.submit(normal, [], "test")
        assert store.flush(10)
        reader = StoreReader(tmp_path)
        for request in (hostile, normal):
            trace_id = request.resource_spans[0].scope_spans[0].spans[0].trace_id.hex()
            assert reader.get_trace(trace_id) is not None
        later = one_trace()
        assert store.submit(later, [], "test") and store.flush(10)  # the writer is still alive
        assert reader.get_trace(later.resource_spans[0].scope_spans[0].spans[0].trace_id.hex()) is not None
        assert registry.get_sample_value("otel_llm_store_written_traces_total") == 3
    finally:
        store.shutdown()


def test_retention_by_age_and_size(tmp_path):
    store, registry = make_store(tmp_path / "age", retention_s=0.5)
    try:
        old = one_trace()
        store.submit(old, [], "test")
        store.flush(10)
        time.sleep(0.6)  # the retention under test is wall-clock age
        store.shutdown()  # the final batch prunes
        assert StoreReader(tmp_path / "age").get_trace(old.resource_spans[0].scope_spans[0].spans[0].trace_id.hex()) is None
        assert registry.get_sample_value("otel_llm_store_pruned_traces_total", {"reason": "age"}) == 1
    finally:
        store.shutdown()
    store, registry = make_store(tmp_path / "size", max_size_bytes=256 * 1024)
    try:
        for _ in range(30):
            store.submit(vllm_batch(1, extra={"padding": "x" * 20_000}), [], "test")
        store.flush(10)
        store.shutdown()
        assert registry.get_sample_value("otel_llm_store_pruned_traces_total", {"reason": "size"}) > 0
        assert registry.get_sample_value("otel_llm_store_size_bytes") <= 256 * 1024
    finally:
        store.shutdown()
