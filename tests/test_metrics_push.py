"""OTLP metrics push (exporters.otlp_metrics), with real parts on loopback:

- to our real Collector build (otlp receiver -> prometheus exporter); a real Prometheus scrapes the
  Collector's exporter and otel-llm's /metrics: histogram_quantile(0.99) of TTFT in both namings
  and the bucket counts are the same from both sources;
- delta temporality: two exports, the second carries only the increments (decoded by a small
  OTLP/HTTP sink in the test; otel-llm is not a metrics receiver);
- the endpoint down, then up: in cumulative mode the next export carries the totals; the failures
  are counted.
"""

from __future__ import annotations

import gzip
import http.server
import threading
import time

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.metrics.v1 import metrics_pb2

from otel_llm_simulate.runner import otlp_exporter_factory, run_plan
from otel_llm_simulate.scenarios import plan
from tests.support.collector import CollectorProcess
from tests.support.otelllm import Scrape, ServerProcess, scrape_metrics, start_server
from tests.support.ports import free_port
from tests.support.prometheus import PrometheusServer

FAST = {"processors": {"tail_sampling": {"decision_wait": "1s", "grace": "100ms"}}}
FAST_RETRY = {"initial_interval": "100ms", "max_interval": "500ms", "max_elapsed_time": "2s"}
TTFT = {"vllm": ("vllm:time_to_first_token_seconds", "vllm:time_to_first_token_seconds"),
        "gen_ai": ("gen_ai.server.time_to_first_token", "gen_ai_server_time_to_first_token_seconds")}


def make_plan(seed: int, rate: float, duration_s: float, scenario: str = "errors"):
    return plan(scenario, seed=seed, rate=rate, duration_s=duration_s, start_ns=time.time_ns() - round(duration_s * 1e9))


def settled(scrape: Scrape, requests: int) -> bool:
    return (scrape.value("otel_llm_traces_in_memory") == 0 and scrape.value("otel_llm_intake_queued_spans") == 0
            and scrape.value("otel_llm_requests_assembled_total") >= requests)


def by_le(buckets: dict[str, float]) -> dict[float, float]:
    return {float(le): value for le, value in buckets.items()}


def poll(compute, ok, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while True:
        value = compute()
        if ok(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}; last: {value!r}"[:4000])
        time.sleep(0.1)


# --- a small OTLP/HTTP metrics sink --------------------------------------------------------------


class MetricsSink:
    """Captures the bodies POSTed to /v1/metrics (decoded), answers 200 with an empty response."""

    def __init__(self, port: int = 0) -> None:
        self.requests: list[ExportMetricsServiceRequest] = []
        self.lock = threading.Lock()
        sink = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportMetricsServiceRequest()
                request.ParseFromString(body)
                with sink.lock:
                    if self.path == "/v1/metrics":
                        sink.requests.append(request)
                payload = ExportMetricsServiceResponse().SerializeToString()
                self.send_response(200 if self.path == "/v1/metrics" else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "MetricsSink":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def snapshot(self) -> list[ExportMetricsServiceRequest]:
        with self.lock:
            return list(self.requests)


def metrics_named(request: ExportMetricsServiceRequest, name: str) -> list[metrics_pb2.Metric]:
    return [m for rm in request.resource_metrics for sm in rm.scope_metrics for m in sm.metrics if m.name == name]


def histogram_buckets(request: ExportMetricsServiceRequest, name: str) -> tuple[dict[float, float], int]:
    """Cumulative ``{le: count}`` summed over the series of histogram ``name`` in one request, and its count."""
    bounds: list[float] = []
    per_bucket: list[int] = []
    count = 0
    for metric in metrics_named(request, name):
        for point in metric.histogram.data_points:
            bounds = list(point.explicit_bounds)
            per_bucket = [a + b for a, b in zip(per_bucket, point.bucket_counts)] if per_bucket \
                else list(point.bucket_counts)
            count += point.count
    out, running = {}, 0
    for bound, n in zip(bounds + [float("inf")], per_bucket):
        running += n
        out[bound] = float(running)
    return out, count


def snapshot_time(request: ExportMetricsServiceRequest) -> int:
    return metrics_named(request, TTFT["vllm"][0])[0].histogram.data_points[0].time_unix_nano


def ttft_count(request: ExportMetricsServiceRequest) -> int:
    return histogram_buckets(request, TTFT["vllm"][0])[1]


# --- 1. through the real Collector into a real Prometheus ------------------------------------------


def test_pushed_metrics_through_the_collector_answer_what_metrics_answers(tmp_path):
    collector_prom_port = free_port()
    otelcol = CollectorProcess(
        tmp_path / "otelcol",
        exporters={"prometheus": {"endpoint": f"127.0.0.1:{collector_prom_port}", "metric_expiration": "30m",
                                  "resource_to_telemetry_conversion": {"enabled": False}}},
        pipelines={"metrics": {"receivers": ["otlp"], "exporters": ["prometheus"]}})
    server = None
    prom = None
    try:
        otelcol.start()
        (tmp_path / "otel-llm").mkdir()
        server = ServerProcess(tmp_path / "otel-llm", {
            **FAST,
            "exporters": {"otlp_metrics": {"protocol": "grpc", "endpoint": otelcol.grpc_endpoint, "interval": "1s",
                                           "timeout": "5s", "retry_on_failure": FAST_RETRY}},
            "service": {"pipelines": {"traces": {"receivers": ["otlp"], "processors": ["memory_limiter", "llm_metrics", "tail_sampling", "redaction"], "exporters": ["prometheus", "store"]},
                                      "metrics": {"exporters": ["otlp_metrics"]}}}})
        server.start()
        prom = PrometheusServer(tmp_path / "prometheus", [f"127.0.0.1:{server.metrics_port}"], extra_scrape_configs=[
            {"job_name": "collector", "metrics_path": "/metrics",
             "static_configs": [{"targets": [f"127.0.0.1:{collector_prom_port}"]}]}])
        prom.start()
        p = make_plan(seed=51, rate=6.0, duration_s=30.0)
        sent = run_plan(p, otlp_exporter_factory(f"127.0.0.1:{server.grpc_port}", "grpc"), realtime=False)
        assert sent.ok and sent.requests_sent == len(p.requests)
        direct = server.wait_until(lambda s: settled(s, len(p.requests)), timeout_s=60, what="settled")
        ttft_total = direct.value("vllm:time_to_first_token_seconds_count")
        assert ttft_total > 50
        # The Collector's exposition carries the same buckets and counters (its names: dots translated,
        # units and _total appended), once an export after the last decision has reached it.
        collector_url = f"http://127.0.0.1:{collector_prom_port}"
        compared = [prom_name for _, prom_name in TTFT.values()] + [
            "gen_ai_server_request_duration_seconds", "vllm:e2e_request_latency_seconds",
            "otel_llm_request_segment_seconds", "gen_ai_client_operation_duration_seconds", "gen_ai_client_token_usage"]
        counters = ("vllm:request_success_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total")

        def counter_series(scrape: Scrape, name: str) -> dict[frozenset, float]:
            keep = ("model_name", "engine_kind", "service_name", "finished_reason")
            return {frozenset((k, v) for k, v in labels if k in keep): value
                    for (n, labels), value in scrape.samples.items() if n == name}

        def views():
            direct, pushed = server.scrape(), scrape_metrics(collector_url)
            return ({n: by_le(direct.buckets(n)) for n in compared} | {n: counter_series(direct, n) for n in counters},
                    {n: by_le(pushed.buckets(n)) for n in compared} | {n: counter_series(pushed, n) for n in counters},
                    direct, pushed)

        seen = poll(views, lambda v: v[0] == v[1], 30, "the Collector's exposition to equal /metrics")
        direct, collector_scrape = seen[2], seen[3]
        empty = [n for n in (*compared, *counters) if not seen[0][n]]
        assert not empty, f"nothing to compare for {empty}"
        assert direct.value("vllm:time_to_first_token_seconds_count") == ttft_total
        figures = {}
        for naming, (_, prom_name) in TTFT.items():
            assert by_le(collector_scrape.buckets(prom_name)) == by_le(direct.buckets(prom_name)), naming
            # Prometheus, scraping both: same bucket counts and same p99.
            def buckets(job: str) -> dict[float, float]:
                return {float(r["metric"]["le"]): float(r["value"][1])
                        for r in prom.query(f'sum by (le) ({prom_name}_bucket{{job="{job}"}})')}

            expected = by_le(direct.buckets(prom_name))
            poll(lambda: (buckets("otel-llm"), buckets("collector")),
                 lambda v: v[0] == expected and v[1] == expected, 30,
                 f"Prometheus to hold {prom_name} from both sources")
            quantiles = {}
            for job in ("otel-llm", "collector"):
                result = prom.query(f'histogram_quantile(0.99, sum by (le) ({prom_name}_bucket{{job="{job}"}}))')
                quantiles[job] = float(result[0]["value"][1])
            assert quantiles["otel-llm"] == quantiles["collector"], quantiles
            figures[naming] = (quantiles, expected[float("inf")], len(expected))
        telemetry = server.scrape()
        assert telemetry.value("otel_llm_metrics_exporter_sent_requests_total") > 0
        print("metrics push via the Collector: " + "; ".join(
            f"{naming} p99 otel-llm {q['otel-llm']:.4f}s = collector {q['collector']:.4f}s, "
            f"{total:.0f} observations in {n} buckets equal" for naming, (q, total, n) in figures.items())
              + f"; {telemetry.value('otel_llm_metrics_exporter_sent_points_total'):.0f} points in "
                f"{telemetry.value('otel_llm_metrics_exporter_sent_requests_total'):.0f} requests sent")
    finally:
        try:
            if prom is not None:
                prom.stop()
            if server is not None and server.process is not None and server.process.poll() is None:
                server.stop(timeout_s=30)
        finally:
            if server is not None:
                server.ensure_stopped()
            otelcol.stop()


# --- 2. delta temporality ---------------------------------------------------------------------------


def exporter_of(running):
    return running.service.components["exporters.otlp_metrics"].exporter


def test_delta_temporality_sends_only_the_increments(tmp_path):
    with MetricsSink() as sink:
        running = start_server(str(tmp_path / "store"), {
            **FAST, "exporters": {"otlp_metrics": {"protocol": "http", "endpoint": f"http://127.0.0.1:{sink.port}",
                                                   "interval": "1h", "temporality": "delta", "timeout": "5s",
                                                   "retry_on_failure": FAST_RETRY}}})
        try:
            exporter = exporter_of(running)
            p1 = make_plan(seed=61, rate=5.0, duration_s=20.0)
            assert run_plan(p1, otlp_exporter_factory(f"127.0.0.1:{running.grpc_port}", "grpc"), realtime=False).ok
            before = running.wait_until(lambda s: settled(s, len(p1.requests)), timeout_s=60, what="phase 1")
            exporter.collect_now()  # what the interval does
            first = poll(sink.snapshot, lambda r: len(r) >= 1, 20, "the first export")[0]
            p2 = make_plan(seed=62, rate=3.0, duration_s=10.0, scenario="steady")
            assert run_plan(p2, otlp_exporter_factory(f"127.0.0.1:{running.grpc_port}", "grpc"), realtime=False).ok
            after = running.wait_until(lambda s: settled(s, len(p1.requests) + len(p2.requests)), timeout_s=60,
                                       what="phase 2")
            exporter.collect_now()
            second = poll(sink.snapshot, lambda r: len(r) >= 2, 20, "the second export")[1]
        finally:
            running.stop()
        for naming, (otlp_name, prom_name) in TTFT.items():
            one, n1 = histogram_buckets(first, otlp_name)
            two, n2 = histogram_buckets(second, otlp_name)
            b, a = by_le(before.buckets(prom_name)), by_le(after.buckets(prom_name))
            assert one == b and n1 == b[float("inf")] > 0, naming
            assert two == {le: a[le] - b[le] for le in a}, f"{naming}: the second export is not the increments"
            assert 0 < n2 < n1 + n2 == a[float("inf")]
            for metric in metrics_named(second, otlp_name):
                assert metric.histogram.aggregation_temporality == metrics_pb2.AGGREGATION_TEMPORALITY_DELTA
                first_time = metrics_named(first, otlp_name)[0].histogram.data_points[0].time_unix_nano
                assert all(pt.start_time_unix_nano == first_time for pt in metric.histogram.data_points)
        # Counters: monotonic delta sums whose second values are the increments.
        (success,) = metrics_named(second, "vllm:request_success")
        assert success.sum.is_monotonic and success.sum.aggregation_temporality == \
            metrics_pb2.AGGREGATION_TEMPORALITY_DELTA
        assert sum(pt.as_int or pt.as_double for pt in success.sum.data_points) == \
            after.value("vllm:request_success_total") - before.value("vllm:request_success_total")
        # Semconv shape of gen_ai.*: dotted name, unit s, dotted attributes, schema URL on its scope.
        (genai,) = metrics_named(first, TTFT["gen_ai"][0])
        assert genai.unit == "s"
        keys = {kv.key for pt in genai.histogram.data_points for kv in pt.attributes}
        assert {"gen_ai.operation.name", "gen_ai.request.model"} <= keys
        scopes = {sm.scope.name: sm.schema_url for rm in first.resource_metrics for sm in rm.scope_metrics
                  if any(m.name.startswith("gen_ai.") for m in sm.metrics)}
        assert scopes == {"otel_llm": "https://opentelemetry.io/schemas/1.41.0"}
        resource = {kv.key: kv.value.string_value for kv in first.resource_metrics[0].resource.attributes}
        assert resource["service.name"] == "otel-llm"
        # Exemplars of kept traces (errors are always kept; the plan has errors).
        exemplars = [e for m in metrics_named(first, "vllm:e2e_request_latency_seconds")
                     for pt in m.histogram.data_points for e in pt.exemplars]
        assert exemplars and all(len(e.trace_id) == 16 and len(e.span_id) == 8 for e in exemplars)
        print(f"delta: first export TTFT count {n1}, second {n2} (= the increment, bucket for bucket); "
              f"{len(exemplars)} e2e exemplars in the first")


# --- 3. endpoint down, then up ----------------------------------------------------------------------


def test_endpoint_down_then_up_loses_nothing_in_cumulative_mode(tmp_path):
    port = free_port()  # nothing listens there yet
    running = start_server(str(tmp_path / "store"), {
        **FAST, "exporters": {"otlp_metrics": {"protocol": "http", "endpoint": f"http://127.0.0.1:{port}",
                                               "interval": "500ms", "timeout": "1s",
                                               "retry_on_failure": FAST_RETRY}}})
    try:
        p = make_plan(seed=71, rate=5.0, duration_s=20.0)
        assert run_plan(p, otlp_exporter_factory(f"127.0.0.1:{running.grpc_port}", "grpc"), realtime=False).ok
        running.wait_until(lambda s: settled(s, len(p.requests)), timeout_s=60, what="settled")
        settled_ns = time.time_ns()
        down = running.wait_until(lambda s: s.value("otel_llm_metrics_exporter_failed_requests_total") >= 3,
                                  timeout_s=60, what="failed exports while the endpoint is down")
        assert down.value("otel_llm_metrics_exporter_sent_requests_total") == 0
        assert down.value("otel_llm_metrics_exporter_failed_points_total") > 0
        with MetricsSink(port) as sink:
            totals = running.scrape()
            totals_ns = time.time_ns()
            expected = by_le(totals.buckets(TTFT["vllm"][1]))
            requests = poll(sink.snapshot, lambda r: any(snapshot_time(q) >= totals_ns for q in r), 30,
                            "an export of a snapshot taken after the endpoint came back")
            up = running.wait_until(lambda s: s.value("otel_llm_metrics_exporter_sent_requests_total") >= 1,
                                    timeout_s=10, what="a sent export counted")
    finally:
        running.stop()
    # Every export of a snapshot taken after the workload (all of it recorded while the endpoint was
    # down) carries every total: nothing lost. Older snapshots still queued carry less, never more.
    after_workload = [q for q in requests if snapshot_time(q) >= settled_ns]
    assert after_workload, "no export of a snapshot taken after the workload"
    first = after_workload[0]
    for q in after_workload:
        assert histogram_buckets(q, TTFT["vllm"][0])[0] == expected, "an export after the outage lacks data"
    counts = [histogram_buckets(q, TTFT["vllm"][0])[1] for q in requests]
    assert counts == sorted(counts) and counts[-1] == expected[float("inf")], counts
    genai, _ = histogram_buckets(first, TTFT["gen_ai"][0])
    assert genai == by_le(totals.buckets(TTFT["gen_ai"][1]))
    for metric in metrics_named(first, TTFT["vllm"][0]):
        assert metric.histogram.aggregation_temporality == metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
    print(f"outage: {down.value('otel_llm_metrics_exporter_failed_requests_total'):.0f} failed attempts "
          f"({down.value('otel_llm_metrics_exporter_failed_points_total'):.0f} points), "
          f"{up.value('otel_llm_metrics_exporter_dropped_snapshots_total'):.0f} snapshots superseded; "
          f"{len(requests)} exports after it, the first of a post-workload snapshot carrying all "
          f"{expected[float('inf')]:.0f} TTFT observations")


# --- 4. the config's pipeline rules -------------------------------------------------------------------


def test_config_runs_only_what_a_pipeline_lists_and_refuses_the_rest():
    import pytest

    from otel_llm.config import ConfigError, config_from_dict

    base = {"exporters": {"otlp_metrics": {"endpoint": "127.0.0.1:4317"}}}
    defaults = config_from_dict(base).exporters.otlp_metrics  # no pipelines: every configured component runs
    assert (defaults.protocol, defaults.interval, defaults.temporality, defaults.timeout) == ("grpc", 15.0,
                                                                                          "cumulative", 10.0)
    assert config_from_dict({**base, "service": {"pipelines": {"metrics": {"exporters": ["otlp_metrics"]}}}})
    for service, path in (
            ({"pipelines": {"traces": {"exporters": []}}}, "exporters.otlp_metrics"),  # in no pipeline: would not run
            ({"pipelines": {"metrics": {"exporters": []}}}, "exporters.otlp_metrics"),
            ({"pipelines": {"traces": {"exporters": ["otlp_metrics"]}}}, "service.pipelines.traces.exporters[0]"),
            ({"pipelines": {"metrics": {"exporters": ["otlp"]}}}, "service.pipelines.metrics.exporters[0]"),
            ({"pipelines": {"metrics": {"receivers": ["otlp"], "exporters": ["otlp_metrics"]}}},
             "service.pipelines.metrics.receivers")):
        with pytest.raises(ConfigError) as info:
            config_from_dict({**base, "service": service})
        assert info.value.path == path, (service, str(info.value))
    for key, value in (("protocol", "udp"), ("temporality", "both"), ("compression", "zstd"), ("interval", "10ms"),
                       ("endpoint", "tempo")):
        with pytest.raises(ConfigError) as info:
            config_from_dict({"exporters": {"otlp_metrics": {key: value}}})
        assert info.value.path == f"exporters.otlp_metrics.{key}", str(info.value)
    with pytest.raises(ConfigError) as info:
        config_from_dict({"exporters": {"otlp_metrics": {"protocol": "http", "endpoint": "127.0.0.1:4318"}}})
    assert info.value.path == "exporters.otlp_metrics.endpoint"


def test_accounting_counters_and_slo_targets_are_pushed_as_on_metrics(tmp_path):
    """SLO outcomes, unpriced tokens and the SLO target reach exporters.otlp_metrics with the values
    /metrics shows (a push-only deployment had none of them)."""
    with MetricsSink() as sink:
        running = start_server(str(tmp_path / "store"), {
            "processors": {**FAST["processors"], "llm_metrics": {
                "slo": {"default": {"e2e": "5s", "target": 0.9}},
                "cost": {"currency": "USD", "prices": {"a-model-nobody-serves": {"input": 1.0}}}}},
            "exporters": {"otlp_metrics": {"protocol": "http", "endpoint": f"http://127.0.0.1:{sink.port}",
                                           "interval": "1h", "timeout": "5s", "retry_on_failure": FAST_RETRY}}})
        try:
            p = make_plan(seed=63, rate=5.0, duration_s=10.0)
            assert run_plan(p, otlp_exporter_factory(f"127.0.0.1:{running.grpc_port}", "grpc"), realtime=False).ok
            scrape = running.wait_until(lambda s: settled(s, len(p.requests)), timeout_s=60, what="the plan")
            exporter_of(running).collect_now()
            (pushed,) = poll(sink.snapshot, lambda r: len(r) >= 1, 20, "an export")[:1]
        finally:
            running.stop()

    def total(name: str) -> float:
        return sum(pt.as_int or pt.as_double for m in metrics_named(pushed, name) for pt in m.sum.data_points)

    def scraped(family: str) -> float:
        return sum(v for (name, _), v in scrape.samples.items() if name == family)

    slo = scraped("otel_llm_slo_requests_total")
    assert slo > 0 and total("otel_llm_slo_requests") == slo
    unpriced = scraped("otel_llm_unpriced_tokens_total")
    assert unpriced > 0 and total("otel_llm_unpriced_tokens") == unpriced
    targets = {pt.as_double for m in metrics_named(pushed, "otel_llm_slo_target_ratio") for pt in m.gauge.data_points}
    assert targets == {0.9}
