"""Label values are bounded in bytes, and the series cap counts bytes as well as series: the
exposition's size, and so a scrape's time, stay bounded whatever the model names a client sends."""

from __future__ import annotations

import time
import urllib.request

from otel_llm.processor.llm_metrics.metrics.definitions import vllm_naming
from otel_llm.processor.llm_metrics.metrics.recorder import MetricsRecorder
from tests.support.otelllm import RunningServer
from tests.support.payloads import vllm_batch
from tests.test_bad_input import grpc_raw

OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"
MIB = 1024 * 1024


def _exposition(server: RunningServer, accept: str = "") -> tuple[int, float, str]:
    started = time.monotonic()
    request = urllib.request.Request(server.metrics_url + "/metrics", headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(request, timeout=120) as response:
        body = response.read()
    return len(body), time.monotonic() - started, body.decode()


def _total(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


def test_hundred_model_names_of_16000_bytes_go_to_the_overflow_series(make_server):
    """Before: 100 vLLM spans with unique 16 000-byte model names made /metrics 704.5 MB (20 s a
    scrape). A value longer than ``max_label_value_bytes`` (256) now sends its observation to the
    overflow series, counted by label; every request is still counted."""
    server = make_server()
    for i in range(100):
        grpc_raw(server, vllm_batch(1, model=f"{i:05d}" + "x" * 15_995).SerializeToString())
    server.wait_for_requests(100, timeout_s=60)
    size, seconds, text = _exposition(server)
    open_size, open_seconds, _ = _exposition(server, OPENMETRICS)
    print(f"\n100 x 16 000-byte names: /metrics {size / MIB:.2f} MiB in {seconds:.2f} s "
          f"(OpenMetrics {open_size / MIB:.2f} MiB in {open_seconds:.2f} s)")
    assert size < 1 * MIB and open_size < 1 * MIB
    assert "x" * 300 not in text
    assert _total(text, "otel_llm_label_values_too_long_total") >= 100
    assert 'otel_llm_label_values_too_long_total{label="model_name"}' in text
    assert _total(text, "otel_llm_series_overflow_total") > 0
    assert server.scrape().value("vllm:e2e_request_latency_seconds_count") == 100  # nothing lost


def test_two_thousand_short_model_names_stay_within_the_byte_budget(make_server):
    """Before: 2 000 short model names made /metrics 80 MB (17-20 s a scrape) and
    ``series_overflow_total`` stayed 0. With the byte budget (``series_limit_mib``: 16 MiB of
    exposition by default) the label sets past it share the overflow series, counted; the text and
    the OpenMetrics exposition (with exemplars) both stay within the budget."""
    server = make_server()
    for batch in range(4):
        grpc_raw(server, vllm_batch(500, model_prefix=f"model-{batch}-").SerializeToString())
    server.wait_for_requests(2000, timeout_s=120)
    size, seconds, text = _exposition(server)
    open_size, open_seconds, _ = _exposition(server, OPENMETRICS)
    print(f"\n2 000 short names: /metrics {size / MIB:.2f} MiB in {seconds:.2f} s "
          f"(OpenMetrics {open_size / MIB:.2f} MiB in {open_seconds:.2f} s)")
    assert size <= 16 * MIB and open_size <= 16 * MIB
    assert _total(text, "otel_llm_series_overflow_total") > 0
    scrape = server.scrape()
    assert scrape.value("vllm:e2e_request_latency_seconds_count") == 2000  # nothing lost
    assert scrape.value("vllm:e2e_request_latency_seconds_count", otel_metric_overflow="true") > 0


def test_the_byte_budget_is_shared_by_every_family_and_counted():
    """A unit view of the budget: a recorder with a 1 MiB budget admits label sets until the
    estimated exposition of all its families would pass it; later ones go to each family's
    overflow series; an over-long value never takes a series of its own."""
    from tests.test_sampling_policies import record

    recorder = MetricsRecorder([vllm_naming(1024)], (), series_limit=100_000, series_limit_bytes=MIB,
                               max_label_value_bytes=64)
    for i in range(2000):
        recorder.record(record(model=f"m{i}"))
    ttft = next(f for f in recorder.families() if f.name == "vllm:time_to_first_token_seconds")
    assert 10 < len(ttft.series) < 2000
    assert ttft.overflowed > 0
    assert recorder.budget.used <= MIB
    recorder.record(record(model="y" * 65))
    assert recorder.too_long == {"model_name": 1}
    assert not any("y" * 65 in key for family in recorder.families() for key in family.series)
