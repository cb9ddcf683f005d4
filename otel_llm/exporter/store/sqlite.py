"""SQLite trace store. One writer thread batches inserts off the hot path (one transaction per batch);
readers (the JSON API, the CLI) open their own connections, which WAL mode lets run beside the writer.

Span rows are keyed by (trace id, span id) and only ever appended (a replay overwrites its own rows),
so the cost of a delivery is that of its spans, not of the trace it joins. The writer notices a
deleted file, a full disk and corrupt pages, counts what they cost and says so through ``problem()``
(``/readyz``); see README.md here.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from prometheus_client import CollectorRegistry

from otel_llm.internal.runtime import name_thread
from otel_llm.internal.telemetry import TelemetryFamily
from otel_llm.pdata.records import RequestRecord
from otel_llm.pdata.span_rows import SpanRow, int64, service_name_of, span_row

log = logging.getLogger(__name__)

DB_NAME = "traces.db"
SORT_COLUMNS = {"ttft": "ttft_s", "e2e": "e2e_s", "queue": "queue_s", "tpot": "tpot_s", "start": "start_time_unix_nano",
                "gateway_overhead": "gateway_overhead_s"}
SUMMARY_COLUMNS = ("trace_id", "span_id", "model", "engine_kind", "service_name", "operation", "outcome", "policy",
                   "model_source", "start_time_unix_nano", "ttft_s", "tpot_s", "e2e_s", "queue_s", "prefill_s",
                   "decode_s", "gateway_overhead_s", "prompt_tokens", "completion_tokens", "segments")

# Spans and requests are rowid tables: rows are appended in write order, (trace id, span id) is a
# separate unique index. Clustered on that key instead (WITHOUT ROWID, the layout before 2026-12),
# rows of random trace ids each dirty a page of their own: the writer's CPU was 1.6x and the file
# 1.7x (docs/development/performance-history.md, "A lean store layout"). ``_rebuild_clustered_tables`` converts an old file.
SCHEMA = """
PRAGMA journal_mode=WAL;
CREATE TABLE IF NOT EXISTS traces (
    trace_id TEXT PRIMARY KEY, stored_at REAL NOT NULL, policy TEXT, span_count INTEGER);
CREATE INDEX IF NOT EXISTS traces_stored_at ON traces(stored_at);
CREATE TABLE IF NOT EXISTS spans (
    trace_id TEXT NOT NULL, span_id TEXT NOT NULL, parent_span_id TEXT, name TEXT, kind INTEGER,
    service_name TEXT, start_time_unix_nano INTEGER, end_time_unix_nano INTEGER, status_code INTEGER,
    status_message TEXT, attributes TEXT, PRIMARY KEY (trace_id, span_id));
CREATE TABLE IF NOT EXISTS requests (
    trace_id TEXT NOT NULL, span_id TEXT NOT NULL, model TEXT, engine_kind TEXT, service_name TEXT, operation TEXT,
    outcome TEXT, policy TEXT, model_source TEXT, start_time_unix_nano INTEGER, ttft_s REAL, tpot_s REAL, e2e_s REAL,
    queue_s REAL, prefill_s REAL, decode_s REAL, gateway_overhead_s REAL, prompt_tokens INTEGER,
    completion_tokens INTEGER, segments TEXT, PRIMARY KEY (trace_id, span_id));
CREATE INDEX IF NOT EXISTS requests_start ON requests(start_time_unix_nano);
CREATE INDEX IF NOT EXISTS requests_model ON requests(model, start_time_unix_nano);
CREATE TABLE IF NOT EXISTS store_probe (id INTEGER PRIMARY KEY, payload BLOB);
"""


_INT64_MAX = (1 << 63) - 1
# Lists without an explicit ``until`` (the web view's, /api/traces) end this far past now: a request
# whose start is years ahead (a broken clock, or a client's lie: 2262) would otherwise top every
# list and pass "last 5 m".
FUTURE_SKEW_NS = 10 * 60 * 10**9

_STORE = "exporters.store"
_DROP_REASONS = ("`reason`: `queue_full`, `unstorable`, `disk_full`, `io_error`, `corrupt`, `write_error`, `shutdown`; "
                 "each kept trace, or late span of one, that is dropped counts once. Spans submitted = "
                 "`otel_llm_store_written_spans_total` + `otel_llm_store_dropped_spans_total`.")
STORE_WRITTEN_TRACES = TelemetryFamily("otel_llm_store_written_traces", "counter",
                              "Kept traces added to the store (late spans of one do not count again).",
                              exposed_by=_STORE, notes="Traces stored = this − `otel_llm_store_pruned_traces_total`.")
STORE_WRITTEN_SPANS = TelemetryFamily("otel_llm_store_written_spans", "counter", "Kept spans written to the store.",
                             exposed_by=_STORE)
STORE_DROPPED_TRACES = TelemetryFamily("otel_llm_store_dropped_traces", "counter",
                              "Kept traces (or late spans of one) the store could not take, by reason.", ("reason",),
                              _STORE, _DROP_REASONS)
STORE_DROPPED_SPANS = TelemetryFamily("otel_llm_store_dropped_spans", "counter",
                             "Kept spans the store could not take, by reason.", ("reason",), _STORE, _DROP_REASONS)
STORE_PRUNED_TRACES = TelemetryFamily("otel_llm_store_pruned_traces", "counter", "Traces deleted by retention, by reason.",
                             ("reason",), _STORE, "`reason`: `age`, `size`, `file_deleted` (the file was deleted or "
                             "replaced under the running store).")
STORE_COMMITS = TelemetryFamily("otel_llm_store_commits", "counter", "Store transactions committed (many traces each).",
                       exposed_by=_STORE)
STORE_REOPENED = TelemetryFamily("otel_llm_store_reopened", "counter", "Store file reopened or recreated, by reason.",
                        ("reason",), _STORE, "`reason`: `file_deleted`, `corrupt` (moved aside), `write_failure`.")
STORE_QUEUE_SIZE = TelemetryFamily("otel_llm_store_queue_size", "gauge", "Kept traces waiting for the store writer.",
                          exposed_by=_STORE)
STORE_SIZE_BYTES = TelemetryFamily("otel_llm_store_size_bytes", "gauge",
                          "Bytes used by the store: live pages plus the -wal file.", exposed_by=_STORE)
STORE_AVAILABLE = TelemetryFamily("otel_llm_store_available", "gauge",
                         "1 while the store can persist, 0 while it cannot (see /readyz).", exposed_by=_STORE,
                         notes="While 0, `/readyz` answers 503 with the reason.")

class StoreError(Exception):
    """The store file cannot be read (corrupt, not a database, unreadable); the message names the file."""


# SQLite primary result codes (the low byte of an extended code) that say the *store* cannot persist,
# as opposed to one trace it cannot take.
_SQLITE_PERM, _SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_READONLY, _SQLITE_IOERR = 3, 5, 6, 8, 10
_SQLITE_CORRUPT, _SQLITE_FULL, _SQLITE_CANTOPEN, _SQLITE_NOTADB = 11, 13, 14, 26
_IDLE_TICK_S = 1.0  # the writer wakes at least this often: file identity, probe, retention
_PROBE_BYTES = 64 * 1024  # a probe write of about one trace tells whether a failed store can persist again
_FLUSH = object()  # queued by flush(): ends the writer's wait for a fuller batch


def _store_failure(exc: BaseException) -> str | None:
    """The drop reason when ``exc`` means the store as a whole cannot persist, else None."""
    if not isinstance(exc, sqlite3.Error):
        return None
    code = (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF
    if code == _SQLITE_FULL:
        return "disk_full"
    if code in (_SQLITE_CORRUPT, _SQLITE_NOTADB):
        return "corrupt"
    if code in (_SQLITE_IOERR, _SQLITE_CANTOPEN, _SQLITE_READONLY, _SQLITE_PERM, _SQLITE_BUSY, _SQLITE_LOCKED):
        return "io_error"
    return None


# Below this much free space an open that fails is the disk's fault: SQLite says "disk I/O error"
# when it cannot create its -wal or -shm file, not "database or disk is full".
_FULL_DISK_BYTES = 1 << 20


def _disk_full(directory: Path, exc: BaseException) -> str | None:
    """What to say when ``exc`` (opening the store) comes of a full disk, else None."""
    try:
        free: int | None = _free_bytes(directory)
    except OSError:
        free = None
    failure = _store_failure(exc)
    said = failure == "disk_full" or (isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT))
    if not said and (failure not in (None, "io_error") or free is None or free >= _FULL_DISK_BYTES):
        return None  # a corrupt file stays corrupt, whatever room is left
    return f"no space left on its filesystem ({'an unknown number of' if free is None else free} bytes free): {exc}"


def _free_bytes(directory: Path) -> int:
    """Bytes an unprivileged writer may still use on the filesystem of ``directory`` (or of the
    nearest existing parent: the store's directory may not exist yet)."""
    while not directory.exists() and directory != directory.parent:
        directory = directory.parent
    stat = os.statvfs(directory)
    return stat.f_bavail * stat.f_frsize


def _file_identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def integrity_problem(path: Path) -> str | None:
    """``PRAGMA quick_check`` of an existing store file: None when sound, else what is wrong.
    Raises sqlite3.Error when the file cannot be opened at all (permissions, a directory...)."""
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        rows = connection.execute("PRAGMA quick_check(1)").fetchall()
    except sqlite3.DatabaseError as exc:
        if _store_failure(exc) != "corrupt":
            raise
        return str(exc)
    finally:
        connection.close()
    return None if rows == [("ok",)] else "; ".join(str(row[0]) for row in rows)


_CLUSTERED_TABLES = ("spans", "requests")


def _rebuild_clustered_tables(connection: sqlite3.Connection, path: Path) -> None:
    """A store file written before the tables were rowid tables gets their layout, rows kept, in
    one transaction (a crash halfway leaves the old layout, converted at the next start). It costs
    a copy of the two tables once: logged, with the time it took. When the copy fails (no room on
    the disk for it) the old layout stays, which works as before, and the store opens; corrupt
    pages raise, as any read of them would."""
    old = [name for name, sql in connection.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'table' AND name IN (?, ?)", _CLUSTERED_TABLES)
        if "WITHOUT ROWID" in sql.upper()]
    if not old:
        return
    started = time.monotonic()
    statements = {name: sql for name, sql in _schema_statements() if name in old}
    connection.execute("BEGIN IMMEDIATE")
    try:
        for name in old:
            connection.execute(f"ALTER TABLE {name} RENAME TO {name}_clustered")
            connection.execute(statements[name])
            connection.execute(f"INSERT INTO {name} SELECT * FROM {name}_clustered")
            connection.execute(f"DROP TABLE {name}_clustered")  # and its indexes, made again below
        for name, sql in _schema_statements():
            if name not in _CLUSTERED_TABLES and sql.upper().startswith("CREATE INDEX"):
                connection.execute(sql)
        connection.execute("COMMIT")
    except sqlite3.Error as exc:
        _rollback(connection)
        if _store_failure(exc) == "corrupt":
            raise
        log.warning("trace store %s: tables %s keep their clustered layout (slower writes; converted at a later "
                    "start): %s", path, ", ".join(old), exc)
        return
    except BaseException:
        _rollback(connection)
        raise
    log.warning("trace store %s: tables %s rebuilt as rowid tables (the layout since 2026-12) in %.1f s",
                path, ", ".join(old), time.monotonic() - started)


def _schema_statements() -> list[tuple[str, str]]:
    """``SCHEMA``'s CREATE statements, each with the table it creates (an index: its own name)."""
    out = []
    for statement in SCHEMA.split(";"):
        statement = statement.strip()
        if statement.upper().startswith("CREATE"):
            words = statement.replace("(", " ").split()
            out.append((words[words.index("EXISTS") + 1], statement))
    return out


def _wal_checkpoint_pages(wal_limit_bytes: int, page_size: int) -> int:
    """WAL pages at which the writer checkpoints: the WAL's size limit, never below SQLite's default."""
    return max(1000, wal_limit_bytes // page_size)


def _span_count(request: ExportTraceServiceRequest) -> int:
    return sum(len(scope.spans) for resource in request.resource_spans for scope in resource.scope_spans)


@dataclass(slots=True)
class _Kept:
    request: ExportTraceServiceRequest | None  # None: its producer built the rows
    records: list[RequestRecord]
    policy: str
    spans: int
    span_rows: list[SpanRow] | None = None  # the request's rows, when its producer built them

    def rows(self) -> list[SpanRow]:
        if self.span_rows is None:
            assert self.request is not None
            self.span_rows = list(_span_rows(self.request))
        return self.span_rows


@dataclass(slots=True)
class _Written:
    new_traces: int = 0
    spans: int = 0
    unstorable: list[_Kept] = field(default_factory=list)


def _span_rows(request: ExportTraceServiceRequest) -> Iterator[SpanRow]:
    """The rows of a request whose producer did not hand them over (``KeptTrace.span_rows``)."""
    for resource_spans in request.resource_spans:
        service = service_name_of(resource_spans.resource)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                yield span_row(span, service)


def _request_row(record: RequestRecord, policy: str) -> tuple[Any, ...]:
    segments = [{"name": s.name, "start_time_unix_nano": s.start_unix_ns, "end_time_unix_nano": s.end_unix_ns}
                for s in record.segments]
    return (record.trace_id.hex(), record.span_id.hex(), record.model, record.engine_kind, record.service_name,
            record.operation_name, record.outcome, policy, record.model_source, int64(record.start_unix_ns),
            record.ttft_s, record.tpot_s, record.e2e_s, record.queue_s, record.prefill_s, record.decode_s,
            record.gateway_overhead_s, record.prompt_tokens, record.completion_tokens, _encode_segments(segments))


_encode_segments = json.JSONEncoder().encode  # json.dumps without an encoder built per call
_INSERT_SPANS = "INSERT OR IGNORE INTO spans VALUES (?,?,?,?,?,?,?,?,?,?,?)"
_REPLACE_SPANS = "INSERT OR REPLACE INTO spans VALUES (?,?,?,?,?,?,?,?,?,?,?)"
_INSERT_TRACE = "INSERT OR IGNORE INTO traces VALUES (?,?,?,?)"
_REPLACE_REQUESTS = f"INSERT OR REPLACE INTO requests VALUES ({','.join('?' * len(SUMMARY_COLUMNS))})"


class TraceStore:
    """The writer. Every kept trace submitted ends up counted exactly once: written, or dropped with
    a reason (spans: ``written_spans + dropped_spans`` = spans submitted)."""

    def __init__(self, directory: Path, retention_s: float, max_size_bytes: int, queue_size: int,
                 registry: CollectorRegistry, block_s: float = 5.0, commit_interval_s: float = 0.1,
                 batch_size: int = 500, prune_interval_s: float = 5.0) -> None:
        self._block_s = block_s
        self.path = directory / DB_NAME
        self._wal_path = directory / (DB_NAME + "-wal")
        self._directory = directory
        self._retention_s = retention_s
        self._max_size_bytes = max_size_bytes
        self._commit_interval_s = max(0.0, min(commit_interval_s, 60.0))
        self._batch_size = max(1, batch_size)
        self._prune_interval_s = prune_interval_s
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=queue_size)
        self._wake = threading.Event()  # ends the writer's wait for a fuller batch
        self._thread: threading.Thread | None = None
        self._idle = threading.Condition()
        self._pending = 0
        self._flushing = 0
        self._abandoned = False
        # Writer-thread state. ``_identity`` (device, inode) of the file the connection has open;
        # ``_problem`` says why the store cannot persist (None when it can), for /readyz.
        self._connection: sqlite3.Connection | None = None
        self._identity: tuple[int, int] | None = None
        self._problem: str | None = None
        self._failure: str | None = None  # the drop reason while the store cannot persist
        self._check_next_open = False  # after SQLITE_CORRUPT: quick_check (and move aside) on reopen
        self._reopen_reason = "write_failure"  # why the connection was closed, counted when one opens again
        self._prune_now = False  # over the size limit, or the disk is full: retention at once, not in 5 s
        self._stored_traces = STORE_WRITTEN_TRACES.counter(registry)
        self._written_spans = STORE_WRITTEN_SPANS.counter(registry)
        self._dropped = STORE_DROPPED_TRACES.counter(registry)
        self._dropped_spans = STORE_DROPPED_SPANS.counter(registry)
        self._pruned = STORE_PRUNED_TRACES.counter(registry)
        self._commits = STORE_COMMITS.counter(registry)
        self._reopened = STORE_REOPENED.counter(registry)
        STORE_QUEUE_SIZE.gauge(registry).set_function(self._queue.qsize)
        STORE_SIZE_BYTES.gauge(registry).set_function(lambda: self._size_bytes)
        STORE_AVAILABLE.gauge(registry).set_function(lambda: 0 if self.problem() else 1)
        self._size_bytes = 0

    # --- submitting ------------------------------------------------------------------------

    def start(self) -> None:
        """Open (creating) the store; a file with corrupt pages is moved aside first. On a full disk
        it starts failed, as a store whose disk fills while it runs (``/readyz`` says why, kept
        traces are dropped counted ``disk_full``, and the writer's probe opens it once there is
        room). Raises OSError or sqlite3.Error when the store cannot be opened for another reason."""
        try:
            self._connection = self._open(check=True, reason="")
        except (OSError, sqlite3.Error) as exc:
            full = _disk_full(self._directory, exc)
            if full is None:
                raise
            self._failed("disk_full", OSError(errno.ENOSPC, full))
        self._thread = threading.Thread(target=self._run, name="otel-llm-store", daemon=True)
        self._thread.start()

    def submit(self, request: ExportTraceServiceRequest | None, records: list[RequestRecord], policy: str,
               span_rows: list[SpanRow] | None = None, spans: int | None = None) -> bool:
        """Queue a kept trace for the writer; ``span_rows``, when given, are the request's rows as
        ``pdata.span_rows.span_row`` reads them (the writer then does not read the request, which
        may be None) and ``spans`` how many there are (else counted in ``request``)."""
        if request is None:
            if span_rows is None or spans is None:
                raise ValueError("a kept trace without its request needs its rows and its span count")
        elif spans is None:
            spans = _span_count(request)
        kept = _Kept(request, records, policy, spans, span_rows)
        with self._idle:
            self._pending += 1
        try:
            # A burst of decisions (a shutdown, a backlog) waits for the writer rather than being lost;
            # the wait backs up into the intake, which refuses retryably. Only a stuck disk drops.
            self._queue.put(kept, timeout=self._block_s)
            if self._queue.qsize() >= self._batch_size:
                self._wake.set()
            return True
        except queue.Full:
            self._done(1)
            self._count_dropped([kept], "queue_full")
            return False

    def problem(self) -> str | None:
        """Why the store cannot persist right now (for /readyz), or None when it can."""
        if self._problem is not None:
            return self._problem
        if self._thread is not None and not self._thread.is_alive() and not self._abandoned:
            return "the store writer has stopped"
        identity = self._identity
        if identity is not None and _file_identity(self.path) != identity:
            return f"{self.path} was deleted or replaced; the store is reopening it"
        return None

    def _done(self, count: int) -> None:
        with self._idle:
            self._pending -= count
            if self._pending <= 0:
                self._idle.notify_all()

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until everything submitted so far is written (the writer commits at once, without
        waiting out ``commit_interval``)."""
        with self._idle:
            if self._pending <= 0:
                return True
            self._flushing += 1
        try:
            try:
                self._queue.put_nowait(_FLUSH)
            except queue.Full:
                pass  # a full queue makes full batches: no wait to cut short
            self._wake.set()
            with self._idle:
                return self._idle.wait_for(lambda: self._pending <= 0, timeout=timeout_s)
        finally:
            with self._idle:
                self._flushing -= 1

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Write what is queued and stop, within ``timeout_s`` in all."""
        deadline = time.monotonic() + timeout_s
        self.flush(timeout_s)
        thread = self._thread
        if thread is None or not thread.is_alive():
            return
        try:
            self._queue.put(None, timeout=max(0.01, deadline - time.monotonic()))
        except queue.Full:
            pass
        self._wake.set()
        thread.join(timeout=max(0.5, deadline - time.monotonic()))  # the last batch and a final retention pass
        if thread.is_alive():  # a stuck disk: what is still queued is lost at exit, and counted
            self._abandoned = True
            with self._queue.mutex:
                lost = [item for item in self._queue.queue if isinstance(item, _Kept)]
                self._queue.queue.clear()
            self._done(len(lost))
            self._count_dropped(lost, "shutdown")

    # --- the writer thread -----------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        # Autocommit mode: the writer issues BEGIN/COMMIT itself, so a batch is one transaction.
        connection = sqlite3.connect(self.path, timeout=30, check_same_thread=False, isolation_level=None)
        connection.execute("PRAGMA synchronous=NORMAL")
        # After a checkpoint the -wal file is cut back to this size instead of keeping its peak.
        wal_limit = max(1 << 20, min(self._max_size_bytes // 8, 64 << 20))
        connection.execute(f"PRAGMA journal_size_limit={wal_limit}")
        # And checkpointed when it reaches that size rather than at SQLite's 1 000 pages (or by the
        # 5 s size check): a page that later batches dirty again is copied into the file once. The
        # random-keyed indexes make that most pages: 10-30 % of the writer's CPU (docs/development/performance-history.md).
        page_size = connection.execute("PRAGMA page_size").fetchone()[0]
        connection.execute(f"PRAGMA wal_autocheckpoint={_wal_checkpoint_pages(wal_limit, page_size)}")
        return connection

    def _open(self, *, check: bool, reason: str) -> sqlite3.Connection:
        """A new writer connection on ``self.path`` (created if missing). With ``check``, an existing
        file is checked first and moved aside when its pages are corrupt."""
        self._directory.mkdir(parents=True, exist_ok=True)
        if check and self.path.exists():
            problem = integrity_problem(self.path)
            if problem is not None:
                self._move_aside(problem)
                reason = "corrupt"
        connection = self._connect()
        try:
            connection.executescript(SCHEMA)
            _rebuild_clustered_tables(connection, self.path)
        except sqlite3.DatabaseError as exc:
            connection.close()
            if not check or _store_failure(exc) != "corrupt":
                raise
            self._move_aside(str(exc))
            reason = "corrupt"
            connection = self._connect()
            connection.executescript(SCHEMA)
        self._identity = _file_identity(self.path)
        if reason:
            self._reopened.labels(reason).inc()
        self._reopen_reason = "write_failure"
        return connection

    def _move_aside(self, problem: str) -> None:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        aside = self.path.with_name(f"{DB_NAME}.corrupt-{stamp}")
        for suffix in ("", "-wal", "-shm"):
            source = self.path.with_name(DB_NAME + suffix)
            if source.exists():
                os.replace(source, aside.with_name(aside.name + suffix))
        log.error("trace store %s is corrupt (%s): moved it aside to %s and started a new, empty store",
                  self.path, problem, aside)

    def _run(self) -> None:
        name_thread("otel-llm-store")
        last_prune = time.monotonic()
        while True:
            batch, stop = self._next_batch()
            try:
                if batch:
                    self._write_batch(batch)
                self._check_file()
                if self._problem is not None and not batch:
                    self._probe()  # idle and failed: nothing else would find out that it works again
                if stop or self._prune_now or time.monotonic() - last_prune > self._prune_interval_s:
                    last_prune = time.monotonic()
                    self._prune_now = False
                    self._prune()
            except Exception:  # the writer thread must outlive anything
                log.exception("trace store writer: unexpected error")
            finally:
                self._done(len(batch))
            if stop:
                if self._connection is not None:
                    self._connection.close()
                    self._connection = None
                return

    def _next_batch(self) -> tuple[list[_Kept], bool]:
        """Up to ``batch_size`` traces: the first one, then whatever arrives within ``commit_interval``
        (no waiting while a flush is waited for). Empty after an idle tick."""
        batch: list[_Kept] = []
        try:
            item = self._queue.get(timeout=_IDLE_TICK_S)
        except queue.Empty:
            return batch, False
        deadline = time.monotonic() + self._commit_interval_s
        while True:
            if item is None:
                return batch, True
            if item is not _FLUSH:
                batch.append(item)
            if len(batch) >= self._batch_size:
                return batch, False
            after_flush = item is _FLUSH
            while True:
                try:
                    item = self._queue.get_nowait()
                    break
                except queue.Empty:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or self._flushing or after_flush or not batch:
                        return batch, False
                    # Out the interval in one wait, not woken for each trace submitted (a thread
                    # switch per trace cost more CPU than writing it): a full queue, a flush or a
                    # shutdown wake it early.
                    self._wake.wait(remaining)
                    self._wake.clear()

    def _count_dropped(self, items: list[_Kept], reason: str) -> None:
        if items:
            self._dropped.labels(reason).inc(len(items))
            self._dropped_spans.labels(reason).inc(sum(item.spans for item in items))

    def _write_batch(self, batch: list[_Kept]) -> None:
        if self._abandoned:
            self._count_dropped(batch, "shutdown")
            return
        self._check_file()  # never write into a file that is no longer there
        connection = self._connection
        if connection is None:
            try:
                connection = self._connection = self._open(check=self._check_next_open, reason=self._reopen_reason)
                self._check_next_open = False
            except Exception as exc:
                reason = self._failure_of(exc, self._failure or "io_error")
                self._count_dropped(batch, reason)
                self._failed(reason, exc)
                return
        try:
            written = self._write(connection, batch)
        except Exception as exc:
            reason = self._failure_of(exc, "write_error")
            self._count_dropped(batch, reason)
            self._failed(reason, exc)
            return
        self._commits.inc()
        self._stored_traces.inc(written.new_traces)
        self._written_spans.inc(written.spans)
        self._count_dropped(written.unstorable, "unstorable")
        if self._problem is not None:
            log.warning("trace store %s persists again", self.path)
            self._problem = self._failure = None
        try:  # a few header reads and a stat: retention follows a fast writer instead of lagging 5 s behind
            self._size_bytes = self._used_bytes(connection, checkpoint=False)
        except sqlite3.Error:
            pass
        if self._size_bytes > self._max_size_bytes:
            self._prune_now = True

    def _failure_of(self, exc: BaseException, otherwise: str) -> str:
        """The drop reason of ``exc``: ``disk_full`` when the disk is (whatever SQLite calls it)."""
        if _disk_full(self._directory, exc) is not None:
            return "disk_full"
        return _store_failure(exc) or otherwise

    def _failed(self, reason: str, exc: BaseException) -> None:
        """The store cannot persist: say so on /readyz, and start over with a new connection at the
        next batch or probe (a connection that saw an I/O error is not trusted again)."""
        if self._problem is None:
            log.error("trace store %s cannot persist (%s): %s; kept traces are dropped from it (counted) until "
                      "it can", self.path, reason, exc)
        self._problem = f"the trace store {self.path} cannot persist ({reason}): {exc}"
        self._failure = reason
        if reason == "corrupt":
            self._check_next_open = True
        if reason == "disk_full":
            self._prune_now = True  # the size limit may free pages inside the file for the next batch
        if self._connection is not None:
            try:
                self._connection.close()
            except sqlite3.Error:
                pass
            self._connection = None

    def _check_file(self) -> None:
        """The file deleted (or replaced) under the open connection: everything written from now on
        would go to an unlinked inode and vanish. Count what went with it and open a new file."""
        connection = self._connection
        if connection is None or _file_identity(self.path) == self._identity:
            return
        try:
            lost = connection.execute("SELECT COUNT(*) FROM traces").fetchone()[0]
        except sqlite3.Error:
            lost = 0
        connection.close()
        self._connection = None
        self._pruned.labels("file_deleted").inc(lost)
        log.error("trace store %s was deleted or replaced while open (%d stored traces went with it); "
                  "opening a new one", self.path, lost)
        self._reopen_reason = "file_deleted"
        try:
            self._connection = self._open(check=True, reason="file_deleted")
        except Exception as exc:
            self._failed("io_error", exc)

    def _probe(self) -> None:
        """While failed and idle: can a write of about one trace's size be committed again?"""
        try:
            if self._connection is None:
                self._connection = self._open(check=self._check_next_open, reason=self._reopen_reason)
                self._check_next_open = False
            connection = self._connection
            connection.execute("BEGIN IMMEDIATE")
            try:
                connection.execute("INSERT OR REPLACE INTO store_probe VALUES (1, ?)", (b"\0" * _PROBE_BYTES,))
                connection.execute("DELETE FROM store_probe")
                connection.execute("COMMIT")
            except BaseException:
                _rollback(connection)
                raise
        except Exception as exc:
            self._failed(self._failure_of(exc, self._failure or "io_error"), exc)
            return
        log.warning("trace store %s persists again", self.path)
        self._problem = self._failure = None

    def _write(self, connection: sqlite3.Connection, kept: list[_Kept]) -> _Written:
        """One transaction for the batch. The deliveries of traces not stored yet go first, one
        statement per table for all of them; those of stored traces (a replay, late spans), and all
        of them when that fails (a trace that cannot be stored), a savepoint per delivery, so a
        trace that cannot be stored is skipped (and counted once the batch commits) and the others
        are written. An error that says the store itself cannot persist (disk full, I/O,
        corruption) aborts the whole batch."""
        now = time.time()
        written = _Written()
        connection.execute("BEGIN")
        try:
            # Disjoint traces: writing the new ones first gives what writing in order gives.
            stored = {id(item) for item in self._of_stored_traces(connection, kept)}
            new = [item for item in kept if id(item) not in stored] if stored else kept
            one_by_one = [item for item in kept if id(item) in stored]
            if new and not self._write_new(connection, new, now, written):
                one_by_one = kept
            for item in one_by_one:
                connection.execute("SAVEPOINT trace")
                try:
                    new_traces, spans = self._write_trace(connection, item, now)
                except (sqlite3.Error, OverflowError, ValueError, TypeError) as exc:
                    if _store_failure(exc) is not None:
                        raise
                    connection.execute("ROLLBACK TO trace")
                    written.unstorable.append(item)
                    log.warning("kept trace not stored: %s", exc)
                else:
                    written.new_traces += new_traces
                    written.spans += spans
                connection.execute("RELEASE trace")
            connection.execute("COMMIT")
        except BaseException:
            _rollback(connection)
            raise
        return written

    @staticmethod
    def _of_stored_traces(connection: sqlite3.Connection, kept: list[_Kept]) -> list[_Kept]:
        """The deliveries with a span of a trace already stored, or of a trace such a delivery has
        too (so the rest share no trace with them), or whose rows cannot be read."""
        trace_ids_of: list[tuple[_Kept, set[str]]] = []
        unreadable: list[_Kept] = []
        for item in kept:
            try:
                trace_ids_of.append((item, {row[0] for row in item.rows()}))
            except (ValueError, TypeError, OverflowError):
                unreadable.append(item)
        ids = list({trace_id for _, trace_ids in trace_ids_of for trace_id in trace_ids})
        marked: set[str] = set()
        for start in range(0, len(ids), 500):
            chunk = ids[start:start + 500]
            marked.update(row[0] for row in connection.execute(
                f"SELECT trace_id FROM traces WHERE trace_id IN ({','.join('?' * len(chunk))})", chunk))
        stored: dict[int, _Kept] = {}
        while marked:
            before = len(stored)
            for item, trace_ids in trace_ids_of:
                if id(item) not in stored and not trace_ids.isdisjoint(marked):
                    stored[id(item)] = item
                    marked |= trace_ids
            if len(stored) == before:
                break
        return unreadable + list(stored.values())

    @staticmethod
    def _write_new(connection: sqlite3.Connection, kept: list[_Kept], now: float, written: _Written) -> bool:
        """The common case, in three statements: every span of the deliveries is new. False (nothing
        written) when one is not, or a trace cannot be stored: ``_write_trace`` then writes each
        on its own. Raises what says the store cannot persist."""
        connection.execute("SAVEPOINT batch")
        try:
            span_rows: list[SpanRow] = []
            trace_rows: list[tuple[str, float, str, int]] = []
            request_rows: list[tuple[Any, ...]] = []
            for item in kept:
                rows = item.rows()
                if not rows:
                    continue
                spans_by_trace: dict[str, int] = {}
                for row in rows:
                    spans_by_trace[row[0]] = spans_by_trace.get(row[0], 0) + 1
                trace_rows.extend((trace_id, now, item.policy, count) for trace_id, count in spans_by_trace.items())
                span_rows.extend(rows)
                request_rows.extend(_request_row(r, item.policy) for r in item.records)
            if connection.executemany(_INSERT_SPANS, span_rows).rowcount == len(span_rows):
                new_traces = TraceStore._add_traces(connection, trace_rows)
                connection.executemany(_REPLACE_REQUESTS, request_rows)
                connection.execute("RELEASE batch")
                written.new_traces += new_traces
                written.spans += len(span_rows)
                return True
        except (sqlite3.Error, OverflowError, ValueError, TypeError) as exc:
            if _store_failure(exc) is not None:
                raise
        connection.execute("ROLLBACK TO batch")
        connection.execute("RELEASE batch")
        return False

    @staticmethod
    def _add_traces(connection: sqlite3.Connection, trace_rows: list[tuple[str, float, str, int]]) -> int:
        """The traces rows of spans just added, all new: one statement; else (late spans of a stored
        trace) one at a time, a stored trace's span count raised. Returns the new traces."""
        connection.execute("SAVEPOINT traces")
        if connection.executemany(_INSERT_TRACE, trace_rows).rowcount == len(trace_rows):
            connection.execute("RELEASE traces")
            return len(trace_rows)
        connection.execute("ROLLBACK TO traces")
        connection.execute("RELEASE traces")
        new_traces = 0
        for row in trace_rows:
            if connection.execute(_INSERT_TRACE, row).rowcount == 1:
                new_traces += 1
            else:
                connection.execute("UPDATE traces SET span_count = span_count + ? WHERE trace_id = ?", (row[3], row[0]))
        return new_traces

    @staticmethod
    def _write_trace(connection: sqlite3.Connection, item: _Kept, now: float) -> tuple[int, int]:
        """Appends: the cost is that of the spans given, whatever the size of the stored trace (late
        spans of a 100 000-span trace cost what they cost at 1 000). Returns (new traces, spans)."""
        spans = item.rows()
        if not spans:
            return 0, 0
        by_trace: dict[str, list[SpanRow]] = {}
        for row in spans:
            by_trace.setdefault(row[0], []).append(row)
        new_traces = 0
        for trace_id, rows in by_trace.items():
            added = connection.executemany(_INSERT_SPANS, rows).rowcount
            if added < len(rows):  # a replay: its spans overwrite the stored ones instead of duplicating
                connection.executemany(_REPLACE_SPANS, rows)
            if connection.execute(_INSERT_TRACE, (trace_id, now, item.policy, added)).rowcount == 1:
                new_traces += 1
            elif added:
                connection.execute("UPDATE traces SET span_count = span_count + ? WHERE trace_id = ?",
                                   (added, trace_id))
        connection.executemany(_REPLACE_REQUESTS, [_request_row(r, item.policy) for r in item.records])
        return new_traces, len(spans)

    # --- retention -------------------------------------------------------------------------

    def _prune(self) -> None:
        connection = self._connection
        if connection is None:
            return
        try:
            self._prune_with(connection)
        except Exception as exc:  # nothing is lost when retention fails: it is retried next time
            log.warning("trace store retention failed: %s", exc)
            if _store_failure(exc) is not None:
                self._failed(_store_failure(exc) or "io_error", exc)

    def _prune_with(self, connection: sqlite3.Connection) -> None:
        cutoff = time.time() - self._retention_s
        with _transaction(connection):
            expired = [row[0] for row in
                       connection.execute("SELECT trace_id FROM traces WHERE stored_at < ?", (cutoff,))]
            self._delete(connection, expired)
        if expired:
            self._pruned.labels("age").inc(len(expired))
        self._size_bytes = self._used_bytes(connection)
        while self._size_bytes > self._max_size_bytes:
            with _transaction(connection):
                total = connection.execute("SELECT COUNT(*) FROM traces").fetchone()[0]
                oldest = [row[0] for row in connection.execute(
                    "SELECT trace_id FROM traces ORDER BY stored_at LIMIT ?", (max(1, total // 10),))]
                if oldest:
                    self._delete(connection, oldest)
            if not oldest:
                break
            self._pruned.labels("size").inc(len(oldest))
            self._size_bytes = self._used_bytes(connection)

    def _used_bytes(self, connection: sqlite3.Connection, checkpoint: bool = True) -> int:
        """Live pages plus the -wal file, after a checkpoint that cuts the WAL back (the WAL is on the
        disk too: a size limit that ignored it let the WAL alone fill a disk). A checkpoint that a
        long reader keeps from completing leaves the WAL uncounted this time, so that one slow API
        call never makes retention delete everything."""
        busy = 0
        if checkpoint:
            connection.execute("PRAGMA busy_timeout=200")
            try:
                busy = connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
            finally:
                connection.execute("PRAGMA busy_timeout=30000")
        page_size = connection.execute("PRAGMA page_size").fetchone()[0]
        pages = connection.execute("PRAGMA page_count").fetchone()[0]
        free = connection.execute("PRAGMA freelist_count").fetchone()[0]
        wal = 0
        if not busy:
            try:
                wal = os.path.getsize(self._wal_path)
            except OSError:
                pass
        return int((pages - free) * page_size) + wal

    @staticmethod
    def _delete(connection: sqlite3.Connection, trace_ids: list[str]) -> None:
        for start in range(0, len(trace_ids), 500):
            chunk = trace_ids[start:start + 500]
            marks = ",".join("?" * len(chunk))
            for table in ("spans", "requests", "traces"):
                connection.execute(f"DELETE FROM {table} WHERE trace_id IN ({marks})", chunk)


def _rollback(connection: sqlite3.Connection) -> None:
    if connection.in_transaction:
        try:
            connection.execute("ROLLBACK")
        except sqlite3.Error:
            pass


@contextmanager
def _transaction(connection: sqlite3.Connection) -> Iterator[None]:
    connection.execute("BEGIN")
    try:
        yield
        connection.execute("COMMIT")
    except BaseException:
        _rollback(connection)
        raise


# A trace answer's page (/api/traces/{id}, the web view's trace page): spans, bytes of their attributes,
# request rows. max_spans_per_trace bounds a trace; these bound one answer whatever that is set to.
TRACE_ANSWER_SPANS = 2000
TRACE_ANSWER_BYTES = 16 << 20
TRACE_ANSWER_REQUESTS = 1000


class StoreReader:
    """Read side for the JSON API and the CLI; opens the database read-only."""

    def __init__(self, path: Path) -> None:
        self.path = path if path.suffix == ".db" else path / DB_NAME

    @contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        """Raises FileNotFoundError when there is no store, StoreError (naming the file) when it
        cannot be read: corrupt pages, not a database, locked past the timeout."""
        if not self.path.exists():
            raise FileNotFoundError(f"no trace store at {self.path}")
        try:
            connection = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=10)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read the trace store {self.path}: {exc}") from None
        connection.row_factory = sqlite3.Row
        try:
            yield connection
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read the trace store {self.path}: {exc}") from None
        finally:
            connection.close()

    def list_requests(self, *, model: str | None = None, outcome: str | None = None, sort: str = "start",
                      limit: int = 50, since_unix_ns: int | None = None, until_unix_ns: int | None = None,
                      service: str | None = None, engine: str | None = None, policy: str | None = None,
                      offset: int = 0, ascending: bool = False) -> list[dict[str, Any]]:
        if sort not in SORT_COLUMNS:
            raise ValueError(f"sort must be one of {', '.join(SORT_COLUMNS)}")
        where: list[str] = []
        params: list[str | int] = []
        for column, value in (("model", model), ("outcome", outcome), ("service_name", service),
                              ("engine_kind", engine), ("policy", policy)):
            if value:
                where.append(f"{column} = ?")
                params.append(value)
        for name, bound in (("since", since_unix_ns), ("until", until_unix_ns)):
            if bound is not None and not -_INT64_MAX - 1 <= bound <= _INT64_MAX:
                raise ValueError(f"{name} must be a Unix time in nanoseconds (a signed 64-bit integer), got {bound}")
        if since_unix_ns is not None:
            where.append("start_time_unix_nano >= ?")
            params.append(since_unix_ns)
        if until_unix_ns is not None:
            where.append("start_time_unix_nano < ?")
            params.append(until_unix_ns)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        column = SORT_COLUMNS[sort]
        direction = "ASC" if ascending else "DESC"
        if sort == "start":  # walks the start-time index: no sort, whatever the store's size or the offset
            order = f"{column} {direction}, trace_id {direction}, span_id {direction}"
        else:  # one pass over the table beats index lookups per matching row (``+``: no index for the filters)
            order = f"{column} IS NULL, {column} {direction}, trace_id, span_id"
            clause = clause.replace("WHERE model =", "WHERE +model =").replace(" AND model =", " AND +model =")
            clause = clause.replace("start_time_unix_nano >=", "+start_time_unix_nano >=").replace(
                "start_time_unix_nano <", "+start_time_unix_nano <")
        query = f"SELECT {', '.join(SUMMARY_COLUMNS)} FROM requests {clause} ORDER BY {order} LIMIT ? OFFSET ?"
        with self._connection() as connection:
            rows = connection.execute(query, (*params, max(1, min(limit, 10_000)), max(0, offset))).fetchall()
        return [_summary(row) for row in rows]

    def distinct(self, column: str, limit: int = 1000) -> list[str]:
        """The values a summary column takes (for filters), most frequent first."""
        if column not in ("model", "engine_kind", "outcome", "policy", "service_name", "operation"):
            raise ValueError(f"no filter on {column}")
        with self._connection() as connection:
            rows = connection.execute(f"SELECT {column} FROM requests WHERE {column} IS NOT NULL GROUP BY {column} "
                                      f"ORDER BY COUNT(*) DESC LIMIT ?", (limit,)).fetchall()
        return [row[0] for row in rows]

    def stats(self) -> dict[str, Any]:
        """Stored traces and requests, the oldest trace's storage time, bytes on disk (with the WAL)."""
        with self._connection() as connection:
            traces, oldest = connection.execute("SELECT COUNT(*), MIN(stored_at) FROM traces").fetchone()
            requests = connection.execute("SELECT COUNT(*) FROM requests").fetchone()[0]
        size = sum(p.stat().st_size for p in (self.path, self.path.with_name(self.path.name + "-wal")) if p.exists())
        return {"path": str(self.path), "traces": traces, "requests": requests, "oldest_stored_at": oldest,
                "size_bytes": size}

    def get_trace(self, trace_id: str, span_offset: int = 0, max_spans: int = TRACE_ANSWER_SPANS,
                  max_bytes: int = TRACE_ANSWER_BYTES) -> dict[str, Any] | None:
        """A stored trace, its spans a page at a time: at most ``max_spans`` spans or about
        ``max_bytes`` of their attributes (at least one span), from ``span_offset`` in start order.
        ``span_count`` is the trace's total; ``next_span_offset`` the next page's offset, or None.
        (One kept trace that grew to 27 000 spans answered 568.7 MB in one piece.)"""
        trace_id = trace_id.lower()
        span_offset = max(0, span_offset)
        with self._connection() as connection:
            total = connection.execute("SELECT COUNT(*) FROM spans WHERE trace_id = ?", (trace_id,)).fetchone()[0]
            if not total:
                return None
            cursor = connection.execute(
                "SELECT trace_id, span_id, parent_span_id, name, kind, service_name, start_time_unix_nano, "
                "end_time_unix_nano, status_code, status_message, attributes FROM spans WHERE trace_id = ? "
                "ORDER BY start_time_unix_nano, end_time_unix_nano DESC, span_id LIMIT ? OFFSET ?",
                (trace_id, max(1, max_spans), span_offset))
            spans: list[dict[str, Any]] = []
            size = 0
            for row in cursor:
                size += len(row["attributes"] or "") + 256
                spans.append({**dict(row), "attributes": json.loads(row["attributes"] or "{}")})
                if size >= max_bytes:
                    break
            cursor.close()
            requests = connection.execute(
                f"SELECT {', '.join(SUMMARY_COLUMNS)} FROM requests WHERE trace_id = ? ORDER BY start_time_unix_nano "
                "LIMIT ?", (trace_id, TRACE_ANSWER_REQUESTS)).fetchall()
        summaries = [_summary(row) for row in requests]
        following = span_offset + len(spans)
        return {
            "trace_id": trace_id,
            "summary": summaries[0] if summaries else {},
            "requests": summaries,
            "spans": spans,
            "span_count": total,
            "span_offset": span_offset,
            "next_span_offset": following if following < total else None,
        }


def _summary(row: sqlite3.Row) -> dict[str, Any]:
    summary = dict(row)
    summary["segments"] = json.loads(summary.get("segments") or "[]")
    return summary
