"""Smoke tests for tests/support/prometheus.py against a real Prometheus."""

from __future__ import annotations

import http.server
import threading
import time

import pytest

from tests.support.prometheus import PrometheusQueryError, PrometheusServer

TEXT_EXPOSITION = b"# TYPE demo_total counter\ndemo_total 42\n"
OPENMETRICS_EXPOSITION = (
    b"# TYPE demo_latency_seconds histogram\n"
    b'demo_latency_seconds_bucket{le="1.0"} 1 # {trace_id="0af7651916cd43dd8448eb211c80319c"} 0.5\n'
    b'demo_latency_seconds_bucket{le="+Inf"} 1\n'
    b"demo_latency_seconds_sum 0.5\n"
    b"demo_latency_seconds_count 1\n"
    b"# EOF\n"
)


def _serve(body: bytes, content_type: str) -> http.server.ThreadingHTTPServer:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def exporter():
    server = _serve(TEXT_EXPOSITION, "text/plain; version=0.0.4; charset=utf-8")
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_scrapes_target_and_runs_promql(tmp_path, exporter):
    with PrometheusServer(tmp_path, [exporter]) as prom:
        assert prom.url.startswith("http://127.0.0.1:") and not prom.url.endswith(":9090")
        result = prom.wait_for(
            'demo_total{job="otel-llm"}',
            lambda r: len(r) == 1 and float(r[0]["value"][1]) == 42,
        )
        assert float(result[0]["value"][1]) == 42
        assert prom.targets_up()

        with pytest.raises(PrometheusQueryError) as excinfo:
            prom.query("sum(demo_total")
        assert excinfo.value.error_type == "bad_data"
        with pytest.raises(PrometheusQueryError):
            prom.wait_for("rate(demo_total)", lambda r: True, timeout_s=2)


def test_exemplar_storage(tmp_path):
    server = _serve(OPENMETRICS_EXPOSITION,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8")
    try:
        target = f"127.0.0.1:{server.server_address[1]}"
        start = time.time() - 60
        with PrometheusServer(tmp_path, [target], exemplars=True) as prom:
            prom.wait_for("demo_latency_seconds_count", lambda r: len(r) == 1)
            deadline = time.monotonic() + 15
            while True:
                ex = prom.query_exemplars("demo_latency_seconds_bucket", start, time.time() + 60)
                if ex or time.monotonic() > deadline:
                    break
                time.sleep(0.25)
            assert ex, "no exemplars stored"
            labels = ex[0]["exemplars"][0]["labels"]
            assert labels["trace_id"] == "0af7651916cd43dd8448eb211c80319c"
    finally:
        server.shutdown()
        server.server_close()
