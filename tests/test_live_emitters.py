"""The official OpenAI instrumentation (``opentelemetry-instrumentation-openai-v2``) run live: the
``openai`` client calls a local OpenAI-compatible upstream and its spans go straight to otel-llm
through the SDK's own OTLP/HTTP exporter. The calls and the upstream are those of the capture
script (``tests/testdata/emitters/capture.py``), so the live run and the captures stay one thing."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from types import ModuleType

from otel_llm.exporter.store.sqlite import StoreReader
from tests.support.captures import CAPTURES, MARKERS
from tests.test_hardening import store_bytes

KEEP_ALL = {"tail_sampling": {"decision_wait": "2s", "grace": "100ms", "policies": [
    {"name": "all", "type": "probabilistic", "probabilistic": {"sampling_percentage": 100}}]}}
SERVER_FAMILIES = ("vllm:request_success_total", "gen_ai_server_request_duration_seconds_count")


def _capture_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("emitter_capture", CAPTURES / "capture.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_official_openai_instrumentation_live(make_server, tmp_path):
    capture = _capture_module()
    upstream, upstream_port = capture.serve(capture.UpstreamHandler)
    server = make_server({"processors": KEEP_ALL})
    scenario = "openai_v2_span_only"  # content on the span (SPAN_ONLY), no HTTP instrumentation
    result_file = tmp_path / "results.json"
    env = capture.child_env(scenario, f"http://127.0.0.1:{server.http_port}", f"http://127.0.0.1:{upstream_port}",
                            str(result_file))
    started = time.monotonic()
    try:
        child = subprocess.run([sys.executable, str(CAPTURES / "capture.py"), "--child", scenario], env=env,
                               capture_output=True, text=True, timeout=120)
    finally:
        upstream.shutdown()
    wall_s = time.monotonic() - started
    assert child.returncode == 0, child.stderr[-3000:]
    results = json.loads(result_file.read_text())
    calls, failed = len(results), sum(1 for r in results if not r["ok"])
    assert calls == 5 and failed == 3  # chat, stream; a 500, a 400, a refused connection

    scrape = server.wait_until(lambda s: s.value("gen_ai_client_operation_duration_seconds_count") >= calls
                               and s.value("otel_llm_traces_in_memory") == 0, timeout_s=30,
                               what="every live call decided")
    assert scrape.value("gen_ai_client_operation_duration_seconds_count") == calls
    assert 0 < scrape.value("gen_ai_client_operation_duration_seconds_sum") < wall_s
    assert scrape.value("gen_ai_client_operation_duration_seconds_count", error_type="") == calls - failed
    assert scrape.value("gen_ai_client_token_usage_count", gen_ai_token_type="input") == calls - failed
    assert scrape.value("gen_ai_client_token_usage_sum", gen_ai_token_type="output") == \
        (calls - failed) * capture.COMPLETION_TOKENS
    for family in SERVER_FAMILIES:
        assert scrape.value(family) == 0, family
    # The prompt went over the wire to otel-llm, and no further.
    assert scrape.value("otel_llm_attributes_redacted_total", reason="content_key") >= 2 * (calls - failed)
    server.service.store.flush()
    rows = StoreReader(server.service.store.path).list_requests()
    assert len(rows) == calls and {row["model"] for row in rows} >= {capture.REQUEST_MODEL}
    db = store_bytes(server.service.store.path)
    for marker in MARKERS:
        assert marker.encode() not in db
