"""The component layout's promises: the config never accepts what the code ignores (the traces
pipeline's processors run as listed, or the config is refused with the path that breaks it), building
components takes no file or lock (``start`` does, and names the component when it cannot), and a
component is one folder (the debug exporter, found and run without any other file naming it)."""

from __future__ import annotations

import fcntl
import logging
import os
import urllib.request
from pathlib import Path

import pytest

from otel_llm.component import Kind, factories
from otel_llm.config import ConfigError, config_from_dict
from otel_llm.service.service import ComponentStartError, Service
from tests.support.otelllm import server_config
from tests.support.payloads import vllm_batch
from tests.test_config_hardening import assert_one_clean_line, run_cli, write_config

ROOT = Path(__file__).resolve().parent.parent
KEEP_ALL = [{"name": "all", "type": "probabilistic", "probabilistic": {"sampling_percentage": 100}}]
LOOPBACK = "127.0.0.1:0"


def pipeline(processors: list[str], exporters: list[str] | None = None) -> dict:
    return {"service": {"pipelines": {"traces": {"receivers": ["otlp"], "processors": processors,
                                                 "exporters": exporters or ["prometheus", "store"]}}}}


def post(server, request) -> None:
    http = urllib.request.Request(f"http://127.0.0.1:{server.http_port}/v1/traces", data=request.SerializeToString(),
                                  headers={"Content-Type": "application/x-protobuf"}, method="POST")
    with urllib.request.urlopen(http, timeout=10) as response:
        assert response.status == 200


def stored_rows(server) -> list[dict]:
    from otel_llm.exporter.store.sqlite import StoreReader

    server.service.store.flush()
    return StoreReader(server.service.store.path).list_requests(limit=1000)


# --- the processors list is honoured -------------------------------------------------------------


@pytest.mark.parametrize("processors,path,words", [
    (["memory_limiter", "tail_sampling", "llm_metrics", "redaction"], "service.pipelines.traces.processors[1]",
     "list llm_metrics before it"),
    (["memory_limiter", "llm_metrics", "tail_sampling"], "service.pipelines.traces.processors", "must list redaction"),
    (["llm_metrics", "memory_limiter", "tail_sampling", "redaction"], "service.pipelines.traces.processors[1]",
     "must come first"),
    (["memory_limiter", "llm_metrics", "redaction", "tail_sampling"], "service.pipelines.traces.processors[2]",
     "list it after tail_sampling"),
    (["llm_metrics", "llm_metrics", "tail_sampling", "redaction"], "service.pipelines.traces.processors[1]",
     "listed twice"),
    (["llm_metrics", "batch", "redaction"], "service.pipelines.traces.processors[1]", "not configured"),
])
def test_a_pipeline_that_cannot_work_is_refused_with_its_path(processors, path, words):
    with pytest.raises(ConfigError) as info:
        config_from_dict(pipeline(processors))
    assert info.value.path == path and words in str(info.value), str(info.value)


def test_without_tail_sampling_every_trace_is_kept_and_no_policy_is_named(make_server):
    server = make_server(pipeline(["memory_limiter", "llm_metrics", "redaction"]))
    assert server.service.pipeline.decision._sampler is None
    post(server, vllm_batch(30))
    scrape = server.wait_for_requests(30)
    assert scrape.value("otel_llm_sampling_decisions_total", policy="none", decision="kept") == 30
    rows = server.service.store and stored_rows(server)
    assert len(rows) == 30 and {row["policy"] for row in rows} == {""}
    assert server.service.pipeline.memory_limiter is not None


def test_without_llm_metrics_nothing_is_measured_and_traces_still_flow(make_server):
    server = make_server(pipeline(["redaction"]))
    assert server.service.pipeline.metrics is None and server.service.pipeline.memory_limiter is None
    post(server, vllm_batch(12))
    server.wait_until(lambda s: s.value("otel_llm_sampling_decisions_total", policy="none", decision="kept") == 12,
                      what="12 traces kept")
    text = urllib.request.urlopen(f"{server.metrics_url}/metrics", timeout=5).read().decode()
    assert "vllm:e2e_request_latency_seconds" not in text and "gen_ai_server_request_duration" not in text
    rows = stored_rows(server)
    assert len(rows) == 0  # no request records, so no store rows: the traces themselves are kept
    from otel_llm.exporter.store.sqlite import StoreReader

    with StoreReader(server.service.store.path)._connection() as connection:
        assert connection.execute("SELECT COUNT(*) FROM traces").fetchone()[0] == 12


def test_default_pipeline_runs_every_configured_processor_in_order():
    config = config_from_dict({})
    assert config.running(Kind.PROCESSOR) == ["memory_limiter", "llm_metrics", "tail_sampling", "redaction"]
    listed = config_from_dict(pipeline(["llm_metrics", "tail_sampling", "redaction"]))
    assert listed.running(Kind.PROCESSOR) == ["llm_metrics", "tail_sampling", "redaction"]
    assert not listed.runs(Kind.PROCESSOR, "memory_limiter")


# --- factories are pure; start acquires and names the component ----------------------------------


def test_building_the_service_touches_no_file_and_start_names_the_component(tmp_path):
    queue_dir = tmp_path / "queue"
    config = config_from_dict(server_config(str(tmp_path / "store"), {
        "exporters": {"otlp": {"endpoint": "127.0.0.1:1", "sending_queue": {"storage": str(queue_dir)}}}}))
    service = Service(config)
    assert not queue_dir.exists() and not (tmp_path / "store").exists()  # nothing opened, created or locked
    # Another process holds the queue's lock: start fails naming the exporter, and stops what it started.
    queue_dir.mkdir()
    fd = os.open(queue_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with pytest.raises(ComponentStartError) as info:
            service.start()
        assert str(info.value).startswith("exporters.otlp: ") and "in use" in str(info.value), str(info.value)
        assert not service.ready.is_set() and service._started == []  # what had started is stopped again
    finally:
        os.close(fd)


def test_two_exporters_claiming_one_directory_fail_validate_not_serve(tmp_path):
    shared = tmp_path / "queue"
    text = (f"exporters:\n  otlp: {{endpoint: '127.0.0.1:1', sending_queue: {{storage: '{shared}'}}}}\n"
            f"  otlphttp: {{endpoint: 'http://127.0.0.1:1', sending_queue: {{storage: '{shared}'}}}}\n")
    result, _ = run_cli("validate", str(write_config(tmp_path, text)))
    assert result.returncode == 2, result.stderr
    assert "exporters.otlphttp.sending_queue.storage" in result.stderr
    assert "is already used by exporters.otlp.sending_queue.storage" in result.stderr
    assert_one_clean_line(result.stderr)


def test_a_lock_held_elsewhere_is_one_line_naming_the_exporter_and_exit_1(tmp_path):
    queue_dir = tmp_path / "queue"
    queue_dir.mkdir()
    text = (f"receivers:\n  otlp:\n    protocols:\n      grpc: {{endpoint: '{LOOPBACK}'}}\n"
            f"exporters:\n  prometheus: {{endpoint: '{LOOPBACK}'}}\n  store: {{path: '{tmp_path / 'store'}'}}\n"
            f"  otlp: {{endpoint: '127.0.0.1:1', sending_queue: {{storage: '{queue_dir}'}}}}\n")
    fd = os.open(queue_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)  # as another otel-llm using this queue would
    try:
        result, _ = run_cli("serve", "--config", str(write_config(tmp_path, text)))
    finally:
        os.close(fd)
    assert result.returncode == 1, result.stderr
    assert "exporters.otlp: sending_queue.storage" in result.stderr and "in use" in result.stderr, result.stderr
    assert_one_clean_line(result.stderr)


# --- a component is one folder: the debug exporter -------------------------------------------------


def test_the_debug_exporter_is_one_folder_that_nothing_else_names():
    assert "debug" in factories(Kind.EXPORTER)
    folder = ROOT / "otel_llm" / "exporter" / "debug"
    for path in (ROOT / "otel_llm").rglob("*.py"):
        if folder in path.parents:
            continue
        text = path.read_text(encoding="utf-8")
        assert "exporter.debug" not in text and "DebugExporter" not in text, f"{path} names the debug exporter"
    assert not config_from_dict({}).exporters.debug  # off unless configured


def test_the_debug_exporter_logs_each_kept_trace_with_hostile_strings_escaped(make_server, caplog):
    caplog.set_level(logging.INFO, logger="otel_llm.exporter.debug")
    server = make_server({"processors": {"tail_sampling": {"policies": KEEP_ALL}},
                          "exporters": {"debug": {"verbosity": "normal", "sampling_initial": 1000}}})
    request = vllm_batch(3, model="evil\nFORGED log line \x1b[31m")
    trace_ids = {bytes(s.trace_id).hex() for s in request.resource_spans[0].scope_spans[0].spans}
    post(server, request)
    server.wait_until(lambda s: s.value("otel_llm_debug_exporter_logged_traces_total", exporter="debug") == 3,
                      what="3 kept traces logged")
    messages = [r.getMessage() for r in caplog.records if r.name == "otel_llm.exporter.debug"]
    logged_ids = {m.split()[2].rstrip(":") for m in messages if m.startswith("kept trace ")}
    assert logged_ids == trace_ids
    requests = [m for m in messages if m.strip().startswith("request ")]
    # vllm_batch sets no finish reason: the outcome says so rather than guessing "stop".
    assert len(requests) == 3 and all("engine=vllm" in m and "outcome=unknown" in m for m in requests), requests
    assert all("\n" not in m and "\x1b" not in m for m in messages)
    assert all("'evil\\nFORGED log line \\x1b[31m'" in m for m in requests)


def test_the_debug_exporter_samples_per_second():
    from otel_llm.exporter.debug.config import DebugExporter
    from otel_llm.exporter.debug.exporter import DebugComponent
    from otel_llm.pdata.records import KeptTrace
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    now = [100.0]
    logged: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            logged.append(record.getMessage())

    handler = Collect()
    logger = logging.getLogger("otel_llm.exporter.debug")
    logger.addHandler(handler)
    previous = logger.level
    logger.setLevel(logging.INFO)
    try:
        debug = DebugComponent("debug", DebugExporter(sampling_initial=2, sampling_thereafter=3), clock=lambda: now[0])
        kept = KeptTrace(ExportTraceServiceRequest(), 0, [], "p")
        results = [debug.consume(kept) for _ in range(9)]  # logged: 1st, 2nd, then the 5th and 8th
        assert results == [True] * 9 and len(logged) == 4
        now[0] = 101.0  # a new second starts over
        debug.consume(kept)
        assert len(logged) == 5
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)
    with pytest.raises(ConfigError) as info:
        config_from_dict({"exporters": {"debug": {"verbosity": "loud"}}})
    assert info.value.path == "exporters.debug.verbosity"
