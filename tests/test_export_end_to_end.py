"""Kept traces leave otel-llm and arrive in a real OTLP backend (a second otel-llm that keeps
everything): exemplars point only at traces in both stores; outages, SIGTERM under load and
SIGKILL with the on-disk queue lose nothing that was accepted."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path


from otel_llm.exporter.store.sqlite import StoreReader
from tests.support.otelllm import ServerProcess
from tests.support.payloads import vllm_batch
from tests.support.ports import free_port
from tests.support.prometheus import PrometheusServer
from tests.support.sampling_workload import send_sampling_workload
from tests.test_bad_input import http_post

KEEP_ALL = {"decision_wait": "2s", "grace": "100ms",
            "policies": [{"name": "all", "type": "probabilistic", "probabilistic": {"sampling_percentage": 100}}]}
FAST_RETRY = {"initial_interval": "50ms", "max_interval": "500ms", "max_elapsed_time": "0s"}


def backend_overrides(port: int | None = None) -> dict:
    grpc = {"endpoint": f"127.0.0.1:{port}"} if port else {}
    return {"receivers": {"otlp": {"protocols": {"grpc": grpc, "http": {}}}},
            "processors": {"tail_sampling": KEEP_ALL}}


def stored_trace_ids(store: Path) -> set[str]:
    reader = StoreReader(store)
    with reader._connection() as connection:
        return {row[0] for row in connection.execute("SELECT trace_id FROM traces")}


def test_exemplars_point_at_traces_in_the_store_and_the_backend(make_server, tmp_path):
    backend = make_server(backend_overrides())
    server = make_server({
        "processors": {"tail_sampling": {"decision_wait": "3s", "grace": "100ms"}},  # the default policies
        "exporters": {"otlp": {"endpoint": f"127.0.0.1:{backend.grpc_port}", "retry_on_failure": FAST_RETRY}},
    })
    prometheus = PrometheusServer(tmp_path / "prom", [server.metrics_url.removeprefix("http://")], exemplars=True)
    prometheus.start()
    try:
        start = time.time()
        sent = send_sampling_workload(server.exporter("grpc"), requests=1500, seed=5)
        server.wait_for_requests(sent.total, timeout_s=60)
        server.service.store.flush()
        kept = stored_trace_ids(server.service.store.path)
        assert len(kept) >= len(sent.errors) + len(sent.aborts) + len(sent.outliers)
        # Everything kept reaches the backend (each kept trace is one export request, plus segment spans).
        backend.wait_until(lambda s: s.value("otel_llm_traces_completed_total") >= len(kept), timeout_s=60)
        backend.service.store.flush()
        in_backend = stored_trace_ids(backend.service.store.path)
        assert kept <= in_backend

        def exemplars() -> list[dict]:
            return prometheus.query_exemplars("vllm:time_to_first_token_seconds_bucket", start - 60, time.time() + 60)

        prometheus.wait_for("sum(vllm:time_to_first_token_seconds_count)",
                            lambda r: bool(r) and float(r[0]["value"][1]) > 0)
        deadline = time.monotonic() + 30
        while not exemplars() and time.monotonic() < deadline:
            time.sleep(0.25)
        found = {e["labels"]["trace_id"] for series in exemplars() for e in series["exemplars"]}
        assert found, "Prometheus stored no exemplars"
        assert found <= kept, f"exemplars of traces that were not kept: {found - kept}"
        assert found <= in_backend
    finally:
        prometheus.stop()


def test_backend_outage_loses_nothing_kept(make_server):
    port = free_port()
    server = make_server({
        "processors": {"tail_sampling": KEEP_ALL},
        "exporters": {"otlp": {"endpoint": f"127.0.0.1:{port}", "retry_on_failure": FAST_RETRY,
                               "sending_queue": {"queue_size": 500}}},
    })
    for _ in range(10):
        assert http_post(server, vllm_batch(20).SerializeToString())[0] == 200
    server.wait_until(lambda s: s.value("otel_llm_exporter_failed_requests_total") >= 5, what="failed attempts")
    backend = make_server(backend_overrides(port))  # the backend comes back on the same port
    server.wait_until(lambda s: s.value("otel_llm_exporter_queue_size") == 0, timeout_s=30, what="queue drained")
    server.service.store.flush()
    kept = stored_trace_ids(server.service.store.path)
    assert len(kept) == 200
    backend.wait_until(lambda s: s.value("otel_llm_traces_completed_total") >= 200, timeout_s=30)
    backend.service.store.flush()
    assert kept == stored_trace_ids(backend.service.store.path)
    assert server.scrape().value("otel_llm_exporter_retries_total") > 0


def test_sigterm_under_load_decides_and_exports_everything_accepted(make_server, tmp_path):
    backend = make_server(backend_overrides())
    process = ServerProcess(tmp_path, {
        "processors": {"tail_sampling": {**KEEP_ALL, "decision_wait": "30s"}},
        "exporters": {"otlp": {"endpoint": f"127.0.0.1:{backend.grpc_port}", "retry_on_failure": FAST_RETRY}},
        "service": {"shutdown_grace": "20s"},
    })
    accepted: set[str] = set()
    stop = threading.Event()

    def load() -> None:
        import urllib.error
        import urllib.request

        while not stop.is_set():
            # Spans waiting for a parent that never comes: only shutdown can decide them.
            batch = vllm_batch(50, parent=True)
            request = urllib.request.Request(f"http://127.0.0.1:{process.http_port}/v1/traces",
                                             data=batch.SerializeToString(),
                                             headers={"Content-Type": "application/x-protobuf"})
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    if response.status == 200:
                        accepted.update(s.trace_id.hex() for s in batch.resource_spans[0].scope_spans[0].spans)
            except (urllib.error.URLError, ConnectionError, OSError):
                continue  # refused or closed during shutdown: not accepted, the client would retry

    threads = [threading.Thread(target=load) for _ in range(3)]
    process.start()
    for thread in threads:
        thread.start()
    try:
        process.wait_until(lambda s: s.value("otel_llm_receiver_accepted_spans_total") >= 3000, what="load")
        assert process.stop(signal.SIGTERM, timeout_s=40) == 0
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=20)
        process.ensure_stopped()
    assert len(accepted) >= 3000
    backend.wait_until(lambda s: s.value("otel_llm_receiver_accepted_spans_total") >= 4 * len(accepted),
                       timeout_s=60, what="every accepted span and its segment spans")
    # They wait for a parent in the backend too, until its decision_wait: then they are stored.
    backend.wait_until(lambda s: s.value("otel_llm_traces_completed_total") >= len(accepted), timeout_s=30)
    backend.service.store.flush()
    missing = accepted - stored_trace_ids(backend.service.store.path)
    assert not missing, (f"{len(missing)} of {len(accepted)} accepted traces never reached the backend; "
                         f"backend store drops: {backend.scrape().value('otel_llm_store_dropped_traces_total')}; "
                         f"server log:\n{process.log_path.read_text()[-3000:]}")
    assert accepted <= stored_trace_ids(tmp_path / "store")


def test_sigkill_and_restart_deliver_the_on_disk_queue(make_server, tmp_path):
    port = free_port()
    queue_dir = tmp_path / "queue"
    process = ServerProcess(tmp_path, {
        "processors": {"tail_sampling": {**KEEP_ALL, "decision_wait": "1s", "grace": "50ms"}},
        "exporters": {"otlp": {"endpoint": f"127.0.0.1:{port}", "retry_on_failure": FAST_RETRY,
                               "sending_queue": {"storage": str(queue_dir)}}},
    })
    process.start()
    try:
        sent: set[str] = set()
        for _ in range(5):
            batch = vllm_batch(30)
            code, _, _ = http_post(type("S", (), {"http_port": process.http_port})(), batch.SerializeToString())
            assert code == 200
            sent.update(s.trace_id.hex() for s in batch.resource_spans[0].scope_spans[0].spans)
        # 150 kept traces, each its engine span and 5 segment spans, batched into export requests on disk.
        process.wait_until(lambda s: s.value("otel_llm_exporter_enqueued_spans_total") == 150 * 6, what="all queued")
        assert list(queue_dir.glob("*.otlpq"))
        process.stop(signal.SIGKILL)
        backend = make_server(backend_overrides(port))
        process.start()  # the same config: the queue directory is replayed
        backend.wait_until(lambda s: s.value("otel_llm_traces_completed_total") >= 150, timeout_s=60)
        backend.service.store.flush()
        assert stored_trace_ids(backend.service.store.path) == sent
        process.wait_until(lambda s: s.value("otel_llm_exporter_queue_size") == 0)
        assert not list(queue_dir.glob("*.otlpq"))
    finally:
        process.ensure_stopped()
