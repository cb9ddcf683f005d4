"""SQLite trace store. One writer thread batches inserts off the hot path; readers (the JSON API,
the CLI) open their own connections, which WAL mode lets run beside the writer.

Rows are keyed by (trace id, span id) with INSERT OR REPLACE, so a replayed trace is stored once.
"""

from __future__ import annotations

import json
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from prometheus_client import CollectorRegistry, Counter, Gauge

from otel_llm.adapters.attributes import any_value_to_python
from otel_llm.assembly.records import RequestRecord

log = logging.getLogger(__name__)

DB_NAME = "traces.db"
SORT_COLUMNS = {"ttft": "ttft_s", "e2e": "e2e_s", "queue": "queue_s", "tpot": "tpot_s", "start": "start_time_unix_nano",
                "gateway_overhead": "gateway_overhead_s"}
SUMMARY_COLUMNS = ("trace_id", "span_id", "model", "engine_kind", "service_name", "operation", "outcome", "policy",
                   "model_source", "start_time_unix_nano", "ttft_s", "tpot_s", "e2e_s", "queue_s", "prefill_s",
                   "decode_s", "gateway_overhead_s", "prompt_tokens", "completion_tokens", "segments")

SCHEMA = """
PRAGMA journal_mode=WAL;
CREATE TABLE IF NOT EXISTS traces (
    trace_id TEXT PRIMARY KEY, stored_at REAL NOT NULL, policy TEXT, span_count INTEGER);
CREATE INDEX IF NOT EXISTS traces_stored_at ON traces(stored_at);
CREATE TABLE IF NOT EXISTS spans (
    trace_id TEXT NOT NULL, span_id TEXT NOT NULL, parent_span_id TEXT, name TEXT, kind INTEGER,
    service_name TEXT, start_time_unix_nano INTEGER, end_time_unix_nano INTEGER, status_code INTEGER,
    status_message TEXT, attributes TEXT, PRIMARY KEY (trace_id, span_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS requests (
    trace_id TEXT NOT NULL, span_id TEXT NOT NULL, model TEXT, engine_kind TEXT, service_name TEXT, operation TEXT,
    outcome TEXT, policy TEXT, model_source TEXT, start_time_unix_nano INTEGER, ttft_s REAL, tpot_s REAL, e2e_s REAL,
    queue_s REAL, prefill_s REAL, decode_s REAL, gateway_overhead_s REAL, prompt_tokens INTEGER,
    completion_tokens INTEGER, segments TEXT, PRIMARY KEY (trace_id, span_id)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS requests_start ON requests(start_time_unix_nano);
CREATE INDEX IF NOT EXISTS requests_model ON requests(model, start_time_unix_nano);
"""


_INT64_MAX = (1 << 63) - 1


def _int64(value: int) -> int:
    """OTLP timestamps are uint64; SQLite integers are signed 64-bit. Past 2262 is not a real time."""
    return value if value <= _INT64_MAX else _INT64_MAX


@dataclass(slots=True)
class _Kept:
    request: ExportTraceServiceRequest
    records: list[RequestRecord]
    policy: str


def _span_rows(request: ExportTraceServiceRequest) -> Iterator[tuple[Any, ...]]:
    for resource_spans in request.resource_spans:
        service = next((kv.value.string_value for kv in resource_spans.resource.attributes if kv.key == "service.name"),
                       "")
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                attributes = {kv.key: any_value_to_python(kv.value) for kv in span.attributes}
                yield (span.trace_id.hex(), span.span_id.hex(), span.parent_span_id.hex(), span.name, span.kind,
                       service, _int64(span.start_time_unix_nano), _int64(span.end_time_unix_nano), span.status.code,
                       span.status.message, json.dumps(attributes, default=str))


def _request_row(record: RequestRecord, policy: str) -> tuple[Any, ...]:
    segments = [{"name": s.name, "start_time_unix_nano": s.start_unix_ns, "end_time_unix_nano": s.end_unix_ns}
                for s in record.segments]
    return (record.trace_id.hex(), record.span_id.hex(), record.model, record.engine_kind, record.service_name,
            record.operation_name, record.outcome, policy, record.model_source, _int64(record.start_unix_ns),
            record.ttft_s, record.tpot_s, record.e2e_s, record.queue_s, record.prefill_s, record.decode_s,
            record.gateway_overhead_s, record.prompt_tokens, record.completion_tokens, json.dumps(segments))


class TraceStore:
    def __init__(self, directory: Path, retention_s: float, max_size_bytes: int, queue_size: int,
                 registry: CollectorRegistry, block_s: float = 5.0) -> None:
        self._block_s = block_s
        self.path = directory / DB_NAME
        self._directory = directory
        self._retention_s = retention_s
        self._max_size_bytes = max_size_bytes
        self._queue: queue.Queue[_Kept | None] = queue.Queue(maxsize=queue_size)
        self._thread: threading.Thread | None = None
        self._idle = threading.Condition()
        self._pending = 0
        self._stored_traces = Counter("otel_llm_store_written_traces", "Kept traces written to the store.",
                                      registry=registry)
        self._dropped = Counter("otel_llm_store_dropped_traces", "Kept traces the store could not take, by reason.",
                                ["reason"], registry=registry)
        self._pruned = Counter("otel_llm_store_pruned_traces", "Traces deleted by retention, by reason.", ["reason"],
                               registry=registry)
        Gauge("otel_llm_store_queue_size", "Kept traces waiting for the store writer.",
              registry=registry).set_function(self._queue.qsize)
        Gauge("otel_llm_store_size_bytes", "Bytes used by the store's live pages.",
              registry=registry).set_function(lambda: self._size_bytes)
        self._size_bytes = 0

    def start(self) -> None:
        self._directory.mkdir(parents=True, exist_ok=True)
        connection = self._connect()
        connection.executescript(SCHEMA)
        connection.close()
        self._thread = threading.Thread(target=self._run, name="otel-llm-store", daemon=True)
        self._thread.start()

    def _connect(self) -> sqlite3.Connection:
        connection = sqlite3.connect(self.path, timeout=30, check_same_thread=False)
        connection.execute("PRAGMA synchronous=NORMAL")
        return connection

    def submit(self, request: ExportTraceServiceRequest, records: list[RequestRecord], policy: str) -> bool:
        with self._idle:
            self._pending += 1
        try:
            # A burst of decisions (a shutdown, a backlog) waits for the writer rather than being lost;
            # the wait backs up into the intake, which refuses retryably. Only a stuck disk drops.
            self._queue.put(_Kept(request, records, policy), timeout=self._block_s)
            return True
        except queue.Full:
            self._done(1)
            self._dropped.labels("queue_full").inc()
            return False

    def _done(self, count: int) -> None:
        with self._idle:
            self._pending -= count
            if self._pending == 0:
                self._idle.notify_all()

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until everything submitted so far is written."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout=timeout_s)

    def shutdown(self, timeout_s: float = 10.0) -> None:
        self.flush(timeout_s)
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=timeout_s)

    def _run(self) -> None:
        connection = self._connect()
        last_prune = 0.0
        while True:
            item = self._queue.get()
            batch = [item]
            while len(batch) < 500:  # one transaction per burst: far fewer fsyncs
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            kept = [b for b in batch if b is not None]
            try:
                if kept:
                    written = self._write(connection, kept)
                    self._stored_traces.inc(written)
                if time.monotonic() - last_prune > 5 or None in batch:
                    self._prune(connection)
                    last_prune = time.monotonic()
            except Exception as exc:  # the writer thread must outlive any one batch
                log.error("trace store write failed: %s", exc)
                self._dropped.labels("write_error").inc(len(kept))
            finally:
                self._done(len(kept))
            if None in batch:
                connection.close()
                return

    def _write(self, connection: sqlite3.Connection, kept: list[_Kept]) -> int:
        """One transaction for the batch, a savepoint per trace: a trace that cannot be stored is
        counted and skipped, the others are written."""
        now = time.time()
        written = 0
        with connection:
            for item in kept:
                connection.execute("SAVEPOINT trace")
                try:
                    self._write_trace(connection, item, now)
                except (sqlite3.Error, OverflowError, ValueError, TypeError) as exc:
                    connection.execute("ROLLBACK TO trace")
                    self._dropped.labels("unstorable").inc()
                    log.warning("kept trace not stored: %s", exc)
                else:
                    written += 1
                connection.execute("RELEASE trace")
        return written

    @staticmethod
    def _write_trace(connection: sqlite3.Connection, item: _Kept, now: float) -> None:
        spans = list(_span_rows(item.request))
        if not spans:
            return
        connection.executemany("INSERT OR REPLACE INTO spans VALUES (?,?,?,?,?,?,?,?,?,?,?)", spans)
        connection.executemany(
            f"INSERT OR REPLACE INTO requests VALUES ({','.join('?' * len(SUMMARY_COLUMNS))})",
            [_request_row(r, item.policy) for r in item.records])
        connection.execute(
            "INSERT INTO traces VALUES (?,?,?,?) ON CONFLICT(trace_id) DO UPDATE SET "
            "span_count = (SELECT COUNT(*) FROM spans WHERE trace_id = excluded.trace_id)",
            (spans[0][0], now, item.policy, len(spans)))

    def _prune(self, connection: sqlite3.Connection) -> None:
        cutoff = time.time() - self._retention_s
        with connection:
            expired = [row[0] for row in connection.execute("SELECT trace_id FROM traces WHERE stored_at < ?", (cutoff,))]
            self._delete(connection, expired)
        if expired:
            self._pruned.labels("age").inc(len(expired))
        self._size_bytes = self._live_bytes(connection)
        while self._size_bytes > self._max_size_bytes:
            with connection:
                total = connection.execute("SELECT COUNT(*) FROM traces").fetchone()[0]
                oldest = [row[0] for row in connection.execute(
                    "SELECT trace_id FROM traces ORDER BY stored_at LIMIT ?", (max(1, total // 10),))]
                if not oldest:
                    break
                self._delete(connection, oldest)
            self._pruned.labels("size").inc(len(oldest))
            self._size_bytes = self._live_bytes(connection)

    @staticmethod
    def _live_bytes(connection: sqlite3.Connection) -> int:
        page_size = connection.execute("PRAGMA page_size").fetchone()[0]
        pages = connection.execute("PRAGMA page_count").fetchone()[0]
        free = connection.execute("PRAGMA freelist_count").fetchone()[0]
        return int((pages - free) * page_size)

    @staticmethod
    def _delete(connection: sqlite3.Connection, trace_ids: list[str]) -> None:
        for start in range(0, len(trace_ids), 500):
            chunk = trace_ids[start:start + 500]
            marks = ",".join("?" * len(chunk))
            for table in ("spans", "requests", "traces"):
                connection.execute(f"DELETE FROM {table} WHERE trace_id IN ({marks})", chunk)


class StoreReader:
    """Read side for the JSON API and the CLI; opens the database read-only."""

    def __init__(self, path: Path) -> None:
        self.path = path if path.suffix == ".db" else path / DB_NAME

    @contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        if not self.path.exists():
            raise FileNotFoundError(f"no trace store at {self.path}")
        connection = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=10)
        connection.row_factory = sqlite3.Row
        try:
            yield connection
        finally:
            connection.close()

    def list_requests(self, *, model: str | None = None, outcome: str | None = None, sort: str = "start",
                      limit: int = 50, since_unix_ns: int | None = None, until_unix_ns: int | None = None,
                      service: str | None = None) -> list[dict[str, Any]]:
        if sort not in SORT_COLUMNS:
            raise ValueError(f"sort must be one of {', '.join(SORT_COLUMNS)}")
        where, params = [], []
        for column, value in (("model", model), ("outcome", outcome), ("service_name", service)):
            if value:
                where.append(f"{column} = ?")
                params.append(value)
        if since_unix_ns is not None:
            where.append("start_time_unix_nano >= ?")
            params.append(since_unix_ns)
        if until_unix_ns is not None:
            where.append("start_time_unix_nano < ?")
            params.append(until_unix_ns)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        column = SORT_COLUMNS[sort]
        query = (f"SELECT {', '.join(SUMMARY_COLUMNS)} FROM requests {clause} "
                 f"ORDER BY {column} IS NULL, {column} DESC LIMIT ?")
        with self._connection() as connection:
            rows = connection.execute(query, (*params, max(1, min(limit, 10_000)))).fetchall()
        return [_summary(row) for row in rows]

    def get_trace(self, trace_id: str) -> dict[str, Any] | None:
        trace_id = trace_id.lower()
        with self._connection() as connection:
            spans = connection.execute(
                "SELECT trace_id, span_id, parent_span_id, name, kind, service_name, start_time_unix_nano, "
                "end_time_unix_nano, status_code, status_message, attributes FROM spans WHERE trace_id = ? "
                "ORDER BY start_time_unix_nano, end_time_unix_nano DESC", (trace_id,)).fetchall()
            if not spans:
                return None
            requests = connection.execute(
                f"SELECT {', '.join(SUMMARY_COLUMNS)} FROM requests WHERE trace_id = ? ORDER BY start_time_unix_nano",
                (trace_id,)).fetchall()
        summaries = [_summary(row) for row in requests]
        return {
            "trace_id": trace_id,
            "summary": summaries[0] if summaries else {},
            "requests": summaries,
            "spans": [{**dict(row), "attributes": json.loads(row["attributes"] or "{}")} for row in spans],
        }


def _summary(row: sqlite3.Row) -> dict[str, Any]:
    summary = dict(row)
    summary["segments"] = json.loads(summary.get("segments") or "[]")
    return summary
