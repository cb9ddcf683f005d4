"""The SQLite store on its own: hostile values never stop the writer; retention by age and size."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from prometheus_client import CollectorRegistry

from otel_llm.exporter.store.sqlite import DB_NAME, StoreReader, TraceStore
from otel_llm.pdata.records import RequestRecord
from tests.support.payloads import vllm_batch


def make_store(tmp_path: Path, retention_s: float = 3600, max_size_bytes: int = 1 << 30) -> tuple[TraceStore, CollectorRegistry]:
    registry = CollectorRegistry()
    store = TraceStore(tmp_path, retention_s, max_size_bytes, 1000, registry)
    store.start()
    return store, registry


def one_trace(**kwargs) -> ExportTraceServiceRequest:
    return vllm_batch(1, **kwargs)


def record(model: str, trace_id: bytes) -> RequestRecord:
    return RequestRecord(trace_id=trace_id, span_id=b"\x02" * 8, engine_kind="vllm", adapter="vllm_v1",
                         service_name="s", model=model, model_source="test", request_model=model,
                         response_model=model, operation_name="chat", provider_name="vllm", outcome="stop",
                         ttft_s=0.2, e2e_s=1.0)


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


def _clustered(path: Path) -> None:
    """Gives a store file the layout stores had before 2026-12 (spans and requests clustered on
    (trace id, span id), WITHOUT ROWID), rows kept: the file an upgraded otel-llm finds."""
    connection = sqlite3.connect(path, isolation_level=None)
    try:
        connection.execute("BEGIN")
        for name, indexes in (("spans", ()), ("requests", ("requests_start", "requests_model"))):
            sql = connection.execute("SELECT sql FROM sqlite_master WHERE name = ?", (name,)).fetchone()[0]
            index_sql = [connection.execute("SELECT sql FROM sqlite_master WHERE name = ?", (index,)).fetchone()[0]
                         for index in indexes]
            connection.execute(f"ALTER TABLE {name} RENAME TO {name}_rowid")
            connection.execute(sql.rstrip().rstrip(";") + " WITHOUT ROWID")
            connection.execute(f"INSERT INTO {name} SELECT * FROM {name}_rowid")
            connection.execute(f"DROP TABLE {name}_rowid")
            for statement in index_sql:
                connection.execute(statement)
        connection.execute("COMMIT")
    finally:
        connection.close()


def _layout(path: Path) -> dict[str, str]:
    connection = sqlite3.connect(path)
    try:
        return {name: sql for name, sql in connection.execute("SELECT name, sql FROM sqlite_master WHERE sql IS NOT NULL")}
    finally:
        connection.close()


def test_a_store_of_the_clustered_layout_is_converted_with_every_row(tmp_path):
    requests = [one_trace(model=f"m{i}") for i in range(3)]
    records = [record(model=f"m{i}", trace_id=r.resource_spans[0].scope_spans[0].spans[0].trace_id) for i, r in
               enumerate(requests)]
    store, _ = make_store(tmp_path)
    try:
        for request, rec in zip(requests, records):
            assert store.submit(request, [rec], "errors")
        assert store.flush(10)
    finally:
        store.shutdown()
    reader = StoreReader(tmp_path)
    trace_ids = [r.resource_spans[0].scope_spans[0].spans[0].trace_id.hex() for r in requests]
    before = [reader.get_trace(t) for t in trace_ids]
    listed = reader.list_requests(limit=10)
    assert all(before) and len(listed) == 3
    db = tmp_path / DB_NAME
    _clustered(db)
    assert "WITHOUT ROWID" in _layout(db)["spans"] and "WITHOUT ROWID" in _layout(db)["requests"]

    store, registry = make_store(tmp_path)
    try:
        layout = _layout(db)
        assert not any("WITHOUT ROWID" in sql.upper() for sql in layout.values()), layout
        assert {"requests_start", "requests_model", "traces_stored_at"} <= set(layout)
        assert [reader.get_trace(t) for t in trace_ids] == before
        assert reader.list_requests(limit=10) == listed
        # (trace id, span id) is still unique: the same trace again adds no span and no request
        assert store.submit(requests[0], [records[0]], "errors") and store.flush(10)
        assert reader.get_trace(trace_ids[0]) == before[0]
        assert len(reader.list_requests(limit=10)) == 3
        later = one_trace(model="later")
        assert store.submit(later, [], "test") and store.flush(10)
        assert reader.get_trace(later.resource_spans[0].scope_spans[0].spans[0].trace_id.hex()) is not None
    finally:
        store.shutdown()


def test_a_conversion_that_fails_keeps_the_old_layout_and_the_store_opens(tmp_path, monkeypatch, caplog):
    from otel_llm.exporter.store import sqlite as store_module

    first = one_trace(model="before")
    store, _ = make_store(tmp_path)
    try:
        assert store.submit(first, [], "test") and store.flush(10)
    finally:
        store.shutdown()
    db = tmp_path / DB_NAME
    _clustered(db)
    # The copy fails part-way (as a full disk makes it): the CREATE of the new table is refused.
    statements = store_module._schema_statements()
    monkeypatch.setattr(store_module, "_schema_statements", lambda: [
        (name, "CREATE TABLE spans (no_such_syntax" if name == "spans" else sql) for name, sql in statements])
    store, registry = make_store(tmp_path)
    try:
        assert "keep their clustered layout" in caplog.text
        layout = _layout(db)
        assert "WITHOUT ROWID" in layout["spans"] and "WITHOUT ROWID" in layout["requests"]
        assert "spans_clustered" not in layout  # rolled back, nothing half-done
        reader = StoreReader(tmp_path)
        assert reader.get_trace(first.resource_spans[0].scope_spans[0].spans[0].trace_id.hex()) is not None
        later = one_trace(model="after")
        assert store.submit(later, [], "test") and store.flush(10)
        assert reader.get_trace(later.resource_spans[0].scope_spans[0].spans[0].trace_id.hex()) is not None
        assert registry.get_sample_value("otel_llm_store_written_traces_total") == 1
    finally:
        store.shutdown()


def test_the_writer_checkpoints_the_wal_at_its_size_limit(tmp_path):
    """The WAL is checkpointed when it reaches its size limit (``max_size_mib``/8, 1-64 MiB), never
    below SQLite's 1 000 pages: what the writer's CPU was measured with (docs/development/performance-history.md)."""
    # max size, the WAL's size limit, the WAL's bytes at a checkpoint
    cases = [(1024 << 20, 64 << 20, 64 << 20), (64 << 20, 8 << 20, 8 << 20), (512 * 1024, 1 << 20, 1000 * 4096)]
    for index, (max_size, wal_limit, checkpoint_bytes) in enumerate(cases):
        store = TraceStore(tmp_path / str(index), 3600, max_size, 100, CollectorRegistry())
        store.start()
        try:
            assert store.submit(vllm_batch(1), [], "all") and store.flush(30)
            connection = store._connection
            assert connection is not None
            page_size = connection.execute("PRAGMA page_size").fetchone()[0]
            pages = connection.execute("PRAGMA wal_autocheckpoint").fetchone()[0]
            assert (page_size, pages * page_size) == (4096, checkpoint_bytes), max_size
            assert connection.execute("PRAGMA journal_size_limit").fetchone()[0] == wal_limit
        finally:
            store.shutdown()
