"""The trace store under faults and growth, on real SQLite files (and `otel-llm serve` as a process
where readiness and restarts matter): late spans of a huge trace cost what they cost on a small one;
commits are batched; a deleted file, a full disk and corrupt pages are detected, counted, reflected
on /readyz and recovered from; the counters agree with what is stored; the CLI and the API answer a
corrupt store or an absurd ``since`` with an error, not a traceback or a closed connection."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from prometheus_client import CollectorRegistry

from otel_llm.exporter.store.sqlite import DB_NAME, StoreReader, TraceStore
from tests.support.otelllm import ServerProcess
from tests.support.payloads import vllm_batch

KEEP_ALL = {"processors": {"tail_sampling": {"decision_wait": "300ms", "grace": "50ms", "policies": [
    {"name": "all", "type": "probabilistic", "probabilistic": {"sampling_percentage": 100}}]}}}


def wait_for(condition: Callable[[], object], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.02)


def spans_of(trace_id: bytes, count: int, *, padding: int = 40) -> ExportTraceServiceRequest:
    """``count`` spans of one trace (as kept_trace_request hands them to the store)."""
    request = ExportTraceServiceRequest()
    resource = request.resource_spans.add()
    kv = resource.resource.attributes.add()
    kv.key, kv.value.string_value = "service.name", "svc"
    scope = resource.scope_spans.add()
    now = time.time_ns()
    for _ in range(count):
        span = scope.spans.add()
        span.trace_id, span.span_id, span.name = trace_id, os.urandom(8), "step"
        span.start_time_unix_nano, span.end_time_unix_nano = now, now + 1000
        attr = span.attributes.add()
        attr.key, attr.value.string_value = "payload", "p" * padding
    return request


def trace_id_of(request: ExportTraceServiceRequest) -> str:
    return request.resource_spans[0].scope_spans[0].spans[0].trace_id.hex()


def db_count(path: Path, sql: str) -> int:
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return connection.execute(sql).fetchone()[0]
    finally:
        connection.close()


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


# --- 6: the cost of a late span does not depend on the size of its trace ---------------------


class CountingStore(TraceStore):
    """Counts the SQLite virtual-machine instructions its connections run: a measure of rows touched
    that does not depend on the machine's speed."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.instructions = 0

    def _connect(self) -> sqlite3.Connection:
        connection = super()._connect()
        connection.set_progress_handler(self._tick, 100)
        return connection

    def _tick(self) -> int:
        self.instructions += 100
        return 0


def late_span_cost(tmp_path: Path, trace_size: int, late: int = 200) -> tuple[float, CountingStore, CollectorRegistry]:
    registry = CollectorRegistry()
    store = CountingStore(tmp_path, 3600, 1 << 34, 100_000, registry)
    store.start()
    trace_id = os.urandom(16)
    for start in range(0, trace_size, 5000):
        assert store.submit(spans_of(trace_id, min(5000, trace_size - start)), [], "all")
    assert store.flush(120)
    late_requests = [spans_of(trace_id, 1) for _ in range(late)]
    before = store.instructions
    for request in late_requests:  # as the pipeline delivers them: one late span at a time
        assert store.submit(request, [], "all")
    assert store.flush(120)
    return (store.instructions - before) / late, store, registry


def test_late_span_cost_does_not_grow_with_the_trace(tmp_path):
    small_cost, small, _ = late_span_cost(tmp_path / "small", 1_000)
    small.shutdown()
    big_cost, big, registry = late_span_cost(tmp_path / "big", 20_000)
    try:
        # Before: the trace's span count was recounted on every write, 20x the rows at 20x the size.
        assert big_cost < 1.5 * small_cost, (small_cost, big_cost)
        # ... and the per-trace summary is still right, as are the counters.
        path = big.path
        assert db_count(path, "SELECT span_count FROM traces") == 20_200 == db_count(path, "SELECT COUNT(*) FROM spans")
        assert value(registry, "otel_llm_store_written_traces_total") == 1
        assert value(registry, "otel_llm_store_written_spans_total") == 20_200
    finally:
        big.shutdown()


def test_counters_agree_with_what_is_stored(tmp_path):
    """A kept trace, its late spans, a replay: one trace written, every span counted once."""
    registry = CollectorRegistry()
    store = TraceStore(tmp_path, 3600, 1 << 30, 1000, registry)
    store.start()
    try:
        trace_id = os.urandom(16)
        first = spans_of(trace_id, 10)
        others = [vllm_batch(1) for _ in range(5)]
        for request in (first, *(spans_of(trace_id, 1) for _ in range(20)), *others, first):  # first twice: a replay
            assert store.submit(request, [], "all")
        assert store.flush(30)
        stored = db_count(store.path, "SELECT COUNT(*) FROM traces")
        assert stored == 6 == value(registry, "otel_llm_store_written_traces_total")
        assert db_count(store.path, f"SELECT span_count FROM traces WHERE trace_id = '{trace_id.hex()}'") == 30
        assert db_count(store.path, "SELECT COUNT(*) FROM spans") == 35
        # submitted = written + dropped, in spans (the replay's 10 are written again, over themselves)
        assert value(registry, "otel_llm_store_written_spans_total") == 10 + 20 + 5 + 10
    finally:
        store.shutdown()


def test_a_batch_of_new_and_stored_traces(tmp_path):
    """New traces (written one statement per table) beside late spans of a stored trace and a replay
    of another (written one by one): each stored as if alone, every span counted once."""
    registry = CollectorRegistry()
    store = TraceStore(tmp_path, 3600, 1 << 30, 1000, registry)
    store.start()
    try:
        a, b, c, d, e = (os.urandom(16) for _ in range(5))
        b_first = spans_of(b, 4)
        for request in (spans_of(a, 3), b_first):
            assert store.submit(request, [], "first")
        assert store.flush(30)
        a_and_e = spans_of(a, 1)  # one delivery with spans of a stored trace and of a new one
        a_and_e.MergeFrom(spans_of(e, 1))
        for request, policy in ((spans_of(a, 2), "late"), (spans_of(c, 5), "new"), (b_first, "replay"),
                                (a_and_e, "a and e"), (spans_of(e, 2), "e"), (spans_of(d, 1), "new")):
            assert store.submit(request, [], policy)
        assert store.flush(30)
        counts = {t.hex(): n for t, n in ((a, 6), (b, 4), (c, 5), (d, 1), (e, 3))}
        for trace_id, spans in counts.items():
            assert db_count(store.path, f"SELECT span_count FROM traces WHERE trace_id = '{trace_id}'") == spans
            assert db_count(store.path, f"SELECT COUNT(*) FROM spans WHERE trace_id = '{trace_id}'") == spans
        assert db_count(store.path, "SELECT COUNT(*) FROM traces WHERE policy = 'first'") == 2
        # e is first stored by the delivery it shares with a stored trace, as in submission order
        assert db_count(store.path, f"SELECT policy = 'a and e' FROM traces WHERE trace_id = '{e.hex()}'") == 1
        assert db_count(store.path, "SELECT COUNT(*) FROM traces") == 5
        assert value(registry, "otel_llm_store_written_traces_total") == 5
        assert value(registry, "otel_llm_store_written_spans_total") == 3 + 4 + 2 + 5 + 4 + 2 + 2 + 1
    finally:
        store.shutdown()


# --- 7: batched commits with bounded latency ------------------------------------------------


def wal_commits(path: Path) -> int:
    """Commit frames in the current WAL generation: how many transactions wrote to it."""
    wal = path.with_name(path.name + "-wal")
    data = wal.read_bytes() if wal.exists() else b""
    if len(data) < 32:
        return 0
    page_size = struct.unpack(">I", data[8:12])[0]
    salts = data[16:24]
    commits, offset = 0, 32
    while offset + 24 + page_size <= len(data):
        header = data[offset:offset + 24]
        if header[8:16] != salts:
            break
        if struct.unpack(">I", header[4:8])[0]:
            commits += 1
        offset += 24 + page_size
    return commits


class NoCheckpointStore(TraceStore):
    def _connect(self) -> sqlite3.Connection:
        connection = super()._connect()
        connection.execute("PRAGMA wal_autocheckpoint=0")  # keep every commit frame in the WAL to count
        return connection


def test_commits_are_batched(tmp_path):
    registry = CollectorRegistry()
    store = NoCheckpointStore(tmp_path, 3600, 1 << 30, 1000, registry, commit_interval_s=30.0, batch_size=25,
                              prune_interval_s=3600)
    store.start()
    try:
        schema = wal_commits(store.path)
        requests = [vllm_batch(1) for _ in range(100)]
        for request in requests:
            assert store.submit(request, [], "all")
        assert store.flush(30)
        assert db_count(store.path, "SELECT COUNT(*) FROM traces") == 100
        # Four transactions of 25 (before: a commit per trace, 100).
        assert wal_commits(store.path) - schema == 4 == value(registry, "otel_llm_store_commits_total")
    finally:
        store.shutdown()


def test_a_lone_trace_is_committed_within_the_commit_interval(tmp_path):
    registry = CollectorRegistry()
    store = TraceStore(tmp_path, 3600, 1 << 30, 1000, registry, commit_interval_s=0.05)
    store.start()
    try:
        request = vllm_batch(1)
        assert store.submit(request, [], "all")  # no flush: the interval alone bounds the wait
        reader = StoreReader(tmp_path)
        wait_for(lambda: reader.get_trace(trace_id_of(request)) is not None, 20, "the trace to be committed")
    finally:
        store.shutdown()


# --- 7: a full disk, the WAL in the size limit -------------------------------------------------


class LimitedStore(TraceStore):
    """A disk that fills: SQLite's max_page_count caps the file, as a full disk would."""

    page_limit: int | None = None

    def _connect(self) -> sqlite3.Connection:
        connection = super()._connect()
        if self.page_limit is not None:
            connection.execute(f"PRAGMA max_page_count={self.page_limit}")
        return connection


def test_a_full_disk_is_counted_reported_and_recovered_from(tmp_path):
    registry = CollectorRegistry()
    store = LimitedStore(tmp_path, 3600, 1 << 30, 1000, registry)
    store.page_limit = 24  # the schema and a few small traces fit, a large one does not
    store.start()
    submitted_spans = 0
    try:
        first = vllm_batch(1)
        assert store.submit(first, [], "all") and store.flush(30)
        submitted_spans += 1
        assert value(registry, "otel_llm_store_written_traces_total") == 1 and store.problem() is None
        big = [vllm_batch(1, extra={"padding": "x" * 30_000}) for _ in range(5)]
        for request in big:
            assert store.submit(request, [], "all")
            assert store.flush(30)
        submitted_spans += 5
        assert value(registry, "otel_llm_store_dropped_traces_total", reason="disk_full") >= 1
        assert "disk_full" in (store.problem() or "")
        assert store._thread is not None and store._thread.is_alive()
        store.page_limit = None  # space returns; with no traffic, the writer's probe finds out
        wait_for(lambda: store.problem() is None, 20, "the store to persist again")
        after = vllm_batch(1)
        assert store.submit(after, [], "all") and store.flush(30)
        submitted_spans += 1
        assert StoreReader(tmp_path).get_trace(trace_id_of(after)) is not None
        stored = db_count(store.path, "SELECT COUNT(*) FROM traces")
        assert stored == value(registry, "otel_llm_store_written_traces_total")
        dropped = sum(value(registry, "otel_llm_store_dropped_spans_total", reason=r)
                      for r in ("disk_full", "unstorable", "io_error", "write_error", "queue_full"))
        assert value(registry, "otel_llm_store_written_spans_total") + dropped == submitted_spans
        assert value(registry, "otel_llm_store_dropped_traces_total", reason="unstorable") == 0
    finally:
        store.shutdown()


def test_size_retention_counts_the_wal(tmp_path):
    limit = 512 * 1024
    registry = CollectorRegistry()
    store = TraceStore(tmp_path, 3600, limit, 1000, registry)
    store.start()
    wal = tmp_path / (DB_NAME + "-wal")
    try:
        for _ in range(100):  # ~2 MiB of kept traces, far past the limit
            assert store.submit(vllm_batch(1, extra={"padding": "y" * 20_000}), [], "all")
        assert store.flush(30)

        def within_limit() -> bool:
            live = db_count(store.path, "PRAGMA page_count") - db_count(store.path, "PRAGMA freelist_count")
            on_disk = live * db_count(store.path, "PRAGMA page_size") + (wal.stat().st_size if wal.exists() else 0)
            return value(registry, "otel_llm_store_pruned_traces_total", reason="size") > 0 and on_disk <= limit

        wait_for(within_limit, 30, "live pages plus the -wal file within the size limit")
        assert value(registry, "otel_llm_store_size_bytes") <= limit
    finally:
        store.shutdown()


# --- 7: the file deleted while running; /readyz while the store cannot persist -----------------


def post_trace(server: ServerProcess, request: ExportTraceServiceRequest) -> None:
    http_request = urllib.request.Request(f"http://127.0.0.1:{server.http_port}/v1/traces",
                                          data=request.SerializeToString(), method="POST",
                                          headers={"Content-Type": "application/x-protobuf"})
    with urllib.request.urlopen(http_request, timeout=10) as response:
        assert response.status == 200


def readyz(server: ServerProcess) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(server.metrics_url + "/readyz", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_a_deleted_store_is_recreated_and_readyz_says_when_it_cannot_persist(tmp_path):
    server = ServerProcess(tmp_path, KEEP_ALL)
    store_dir = tmp_path / "store"
    server.start()
    try:
        first = vllm_batch(1)
        post_trace(server, first)
        server.wait_until(lambda s: s.value("otel_llm_store_written_traces_total") >= 1, what="the first trace stored")
        shutil.rmtree(store_dir)  # the file goes while the writer has it open ...
        store_dir.write_text("not a directory")  # ... and nothing can be created in its place
        assert readyz(server)[0] == 503  # at once: the path no longer names the open file
        wait_for(lambda: "cannot persist" in readyz(server)[1], 20, "/readyz to say the store cannot persist")
        post_trace(server, vllm_batch(1))  # kept while the store cannot take it: counted, not "written"
        server.wait_until(lambda s: s.value("otel_llm_store_dropped_traces_total", reason="io_error") >= 1,
                          what="the trace dropped from the store, counted")
        store_dir.unlink()  # the directory can be created again
        wait_for(lambda: readyz(server)[0] == 200, 20, "/readyz ready again")
        third = vllm_batch(1)
        post_trace(server, third)
        scrape = server.wait_until(lambda s: s.value("otel_llm_store_written_traces_total") >= 2,
                                   what="the third trace stored")
        assert scrape.value("otel_llm_store_reopened_total", reason="file_deleted") == 1
        assert scrape.value("otel_llm_store_pruned_traces_total", reason="file_deleted") == 1
        assert server.stop() == 0
    finally:
        server.ensure_stopped()
    # After the restart the new file holds what was written after the deletion.
    reader = StoreReader(store_dir)
    assert reader.get_trace(trace_id_of(third)) is not None
    assert reader.get_trace(trace_id_of(first)) is None
    assert db_count(store_dir / DB_NAME, "SELECT COUNT(*) FROM traces") == 1


def test_a_deleted_store_file_is_recreated(tmp_path):
    registry = CollectorRegistry()
    store = TraceStore(tmp_path, 3600, 1 << 30, 1000, registry)
    store.start()
    try:
        assert store.submit(vllm_batch(1), [], "all") and store.flush(30)
        for suffix in ("", "-wal", "-shm"):
            (tmp_path / (DB_NAME + suffix)).unlink(missing_ok=True)
        after = vllm_batch(1)
        assert store.submit(after, [], "all") and store.flush(30)  # checked before the commit: not into the void
        assert (tmp_path / DB_NAME).exists()
        assert StoreReader(tmp_path).get_trace(trace_id_of(after)) is not None
        assert value(registry, "otel_llm_store_reopened_total", reason="file_deleted") == 1
        assert value(registry, "otel_llm_store_written_traces_total") - \
            value(registry, "otel_llm_store_pruned_traces_total", reason="file_deleted") == \
            db_count(tmp_path / DB_NAME, "SELECT COUNT(*) FROM traces") == 1
    finally:
        store.shutdown()


# --- 10: corrupt pages, the CLI, the API --------------------------------------------------------


def corrupt_store(directory: Path, traces: int = 200) -> list[str]:
    """A store with data, then garbage over every page but the first (the schema still reads)."""
    registry = CollectorRegistry()
    store = TraceStore(directory, 3600, 1 << 30, 1000, registry)
    store.start()
    requests = [vllm_batch(1, extra={"padding": "z" * 2000}) for _ in range(traces)]
    for request in requests:
        store.submit(request, [], "all")
    store.flush(30)
    store.shutdown()
    path = directory / DB_NAME
    data = bytearray(path.read_bytes())
    page_size = struct.unpack(">H", data[16:18])[0]
    for offset in range(2 * page_size, len(data), page_size):  # leave pages 1 and 2 (schema, first root)
        data[offset:offset + 64] = os.urandom(64)
    path.write_bytes(bytes(data))
    return [trace_id_of(r) for r in requests]


def test_a_corrupt_store_is_moved_aside_at_start(tmp_path):
    trace_ids = corrupt_store(tmp_path / "store")
    server = ServerProcess(tmp_path, KEEP_ALL)
    server.start()
    try:
        aside = sorted((tmp_path / "store").glob(f"{DB_NAME}.corrupt-*"))
        assert aside and aside[0].stat().st_size > 0, "the corrupt file is kept, beside the new store"
        assert str(tmp_path / "store" / DB_NAME) in server.log_path.read_text()
        assert readyz(server)[0] == 200
        scrape = server.scrape()
        assert scrape.value("otel_llm_store_reopened_total", reason="corrupt") == 1
        fresh = vllm_batch(1)
        post_trace(server, fresh)
        server.wait_until(lambda s: s.value("otel_llm_store_written_traces_total") >= 1, what="a trace stored")
        assert server.stop() == 0
    finally:
        server.ensure_stopped()
    reader = StoreReader(tmp_path / "store")
    assert reader.get_trace(trace_id_of(fresh)) is not None
    assert reader.get_trace(trace_ids[0]) is None


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "otel_llm", *args], capture_output=True, text=True, timeout=60)


def test_the_cli_on_a_corrupt_store_prints_one_line_and_exits_1(tmp_path):
    corrupt = tmp_path / "corrupt"
    trace_ids = corrupt_store(corrupt)
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / DB_NAME).write_bytes(os.urandom(8192))  # not a database at all
    for directory in (corrupt, garbage):
        for args in (("traces", "--store", str(directory), "--sort", "ttft"),
                     ("trace", trace_ids[-1], "--store", str(directory))):
            result = run_cli(*args)
            if directory == corrupt and result.returncode == 0:
                continue  # a read that touched no corrupt page is a correct answer
            assert result.returncode == 1, (args, result.stdout, result.stderr)
            assert "Traceback" not in result.stderr, result.stderr
            lines = result.stderr.strip().splitlines()
            assert len(lines) == 1 and str(directory / DB_NAME) in lines[0], result.stderr
    result = run_cli("traces", "--store", str(garbage))
    assert result.returncode == 1 and "not a database" in result.stderr


def test_api_since_beyond_int64_is_a_400(make_server):
    server = make_server()
    for query in ("since=99999999999999999999", "until=-99999999999999999999", "since=1e9"):
        try:
            urllib.request.urlopen(f"{server.metrics_url}/api/traces?{query}", timeout=10)
        except urllib.error.HTTPError as err:
            assert err.code == 400, query
            body = json.loads(err.read())
            assert "since" in body["error"] or "until" in body["error"], body
        else:
            raise AssertionError(f"{query}: expected 400")
    with urllib.request.urlopen(f"{server.metrics_url}/api/traces?since=9223372036854775807", timeout=10) as response:
        assert json.loads(response.read()) == {"traces": []}
