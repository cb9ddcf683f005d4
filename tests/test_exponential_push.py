"""Exponential histograms in ``exporters.otlp_metrics`` (``histogram: exponential``), through the real
Collector (our build, collector-config/otelcol-llm-front: otlp receiver -> otlp_http exporter) into
a small OTLP/HTTP sink, and read back as the Collector forwarded them.

Expected scales and bucket counts are computed here from the spans as sent, by the data model's
definition (spec ``metrics/data-model.md`` "ExponentialHistogram": at scale ``s`` bucket ``i`` holds
``(2**(i/2**s), 2**((i+1)/2**s)]``), not with the SDK mapping the exporter uses: the largest scale
<= 20 whose index range fits 160 buckets (the SDK defaults). The spans are the real openai-v2
instrumentation's (tests/testdata/emitters, openai_v2_span_only); their durations are what
``gen_ai.client.operation.duration`` observes.
"""

from __future__ import annotations

import math

import pytest
from opentelemetry.proto.metrics.v1 import metrics_pb2

from otel_llm.config import ConfigError, config_from_dict
from tests.support.captures import attribute, duration_s, replay
from tests.support.collector import CollectorProcess
from tests.test_metrics_push import MetricsSink, metrics_named, poll

CAPTURE = "openai_v2_span_only"
DURATION = "gen_ai.client.operation.duration"
MAX_SIZE, MAX_SCALE = 160, 20


def bucket_index(value: float, scale: int) -> int:
    """The index whose bucket ``(2**(i/2**s), 2**((i+1)/2**s)]`` holds ``value``: ceil(log2(v) * 2**s) - 1."""
    position = math.log2(value) * 2**scale
    # The captured values are nowhere near a boundary at the scales used; a float rounding could
    # otherwise put one a bucket off, which this makes fail loudly rather than silently agree.
    assert abs(position - round(position)) > 1e-6, (value, scale)
    return math.ceil(position) - 1


def expected_state(values: list[float]) -> tuple[int, dict[int, int]]:
    for scale in range(MAX_SCALE, -11, -1):
        indexes = [bucket_index(v, scale) for v in values]
        if max(indexes) - min(indexes) + 1 <= MAX_SIZE:
            counts: dict[int, int] = {}
            for index in indexes:
                counts[index] = counts.get(index, 0) + 1
            return scale, counts
    raise AssertionError("no scale fits")


def test_exponential_histograms_through_the_collector_have_the_data_models_scale_and_counts(tmp_path, make_server):
    with MetricsSink() as sink:
        otelcol = CollectorProcess(
            tmp_path / "otelcol",
            exporters={"otlphttp": {"endpoint": f"http://127.0.0.1:{sink.port}", "compression": "none",
                                    "retry_on_failure": {"enabled": False}}},
            pipelines={"metrics": {"receivers": ["otlp"], "exporters": ["otlphttp"]}})
        otelcol.start()
        try:
            # series_limit 2: of the capture's 4 label sets (answered calls, and 3 error types) two
            # share the overflow series, pushed with the SDKs' otel.metric.overflow=true.
            server = make_server({
                "processors": {"llm_metrics": {"series_limit": 2}},
                "exporters": {"otlp_metrics": {"protocol": "grpc", "endpoint": otelcol.grpc_endpoint,
                                               "interval": "1h", "timeout": "5s", "histogram": "exponential"}}})
            sent = replay(server, CAPTURE)
            spans = sent.spans
            scrape = server.wait_until(
                lambda s: s.value("gen_ai_client_operation_duration_seconds_count") == len(spans)
                and s.value("otel_llm_traces_in_memory") == 0, timeout_s=30, what="the capture's calls")
            server.service.components["exporters.otlp_metrics"].exporter.collect_now()

            def duration_metrics():
                return [m for request in sink.snapshot() for m in metrics_named(request, DURATION)]

            (metric,) = poll(duration_metrics, lambda ms: len(ms) >= 1, 30, "the Collector's forward")
        finally:
            otelcol.stop()
    assert metric.WhichOneof("data") == "exponential_histogram"
    assert metric.exponential_histogram.aggregation_temporality == metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
    points = list(metric.exponential_histogram.data_points)
    # The values of each label set, from the spans as sent (the error type tells the sets apart).
    by_error: dict[str, list[float]] = {}
    for span in spans:
        by_error.setdefault(attribute(span, "error.type") or "", []).append(duration_s(span))
    overflow = [p for p in points if any(kv.key == "otel.metric.overflow" and kv.value.string_value == "true"
                                         for kv in p.attributes)]
    assert len(overflow) == 1 and len(points) == 3
    own_errors = set()
    for point in points:
        if point in overflow:
            continue  # checked below, once the label sets with series of their own are known
        error = {kv.key: kv.value.string_value for kv in point.attributes}.get("error.type", "")
        own_errors.add(error)
        _check(point, by_error[error])
    (overflow_point,) = overflow
    overflow_values = [v for error, vs in by_error.items() if error not in own_errors for v in vs]
    assert len(overflow_values) == 2
    _check(overflow_point, overflow_values)
    # The whole: every call once; /metrics keeps its explicit buckets.
    assert sum(p.count for p in points) == len(spans) == 5
    assert scrape.value("gen_ai_client_operation_duration_seconds_bucket", le="+Inf") == 5
    print("exponential points: " + "; ".join(
        f"scale {p.scale} offset {p.positive.offset} counts {list(p.positive.bucket_counts)[:3]}... "
        f"count {p.count}" for p in points))


def _check(point: metrics_pb2.ExponentialHistogramDataPoint, values: list[float]) -> None:
    scale, counts = expected_state(values)
    assert point.scale == scale, (point.scale, scale, values)
    assert point.count == len(values) and point.zero_count == 0
    assert point.sum == pytest.approx(sum(values))
    got = {point.positive.offset + i: c for i, c in enumerate(point.positive.bucket_counts) if c}
    assert got == counts, (got, counts, values)
    assert not point.negative.bucket_counts


def test_a_state_built_with_larger_limits_and_fitted_equals_one_built_with_the_smaller():
    """Two exporters may ask for different limits; the recorder keeps the larger and each fits a copy."""
    from otel_llm.processor.llm_metrics.metrics.exponential import ExponentialState

    values = [0.0123 * 1.37**k for k in range(40)] + [0.0, 7.5, 0.5]
    large, small = ExponentialState(320, 20), ExponentialState(40, 12)
    for value in values:
        large.observe(value)
        small.observe(value)
    fitted = large.fitted(40, 12)
    assert (fitted.scale, fitted.zero_count, fitted.positive.dense()) == \
        (small.scale, small.zero_count, small.positive.dense())
    assert small.zero_count == 1 and sum(small.positive.counts.values()) == len(values) - 1
    # Independently: the largest scale <= 12 whose index range of the positive values fits 40 buckets.
    positive = [v for v in values if v > 0]
    for scale in range(12, -11, -1):
        indexes = [math.ceil(math.log2(v) * 2**scale) - 1 for v in positive]
        if max(indexes) - min(indexes) + 1 <= 40:
            break
    assert small.scale == scale < 12


@pytest.mark.parametrize("block,path", [
    ({"histogram": "native"}, "exporters.otlp_metrics.histogram"),
    ({"histogram": "exponential", "exponential": {"max_size": 1}}, "exporters.otlp_metrics.exponential.max_size"),
    ({"histogram": "exponential", "exponential": {"max_scale": 21}}, "exporters.otlp_metrics.exponential.max_scale"),
    ({"exponential": {"max_size": 80}}, "exporters.otlp_metrics.exponential"),  # ignored without exponential
])
def test_config_refuses_bad_histogram_options(block, path):
    with pytest.raises(ConfigError) as error:
        config_from_dict({"exporters": {"otlp_metrics": block}})
    assert path in str(error.value)


def test_delta_of_two_cumulative_states_is_the_later_observations_at_the_coarser_scale():
    """``temporality: delta`` pushes the difference from the last successful export; the earlier state
    may be at a finer scale (fewer values spread less), so both are compared at the coarser one."""
    from otel_llm.exporter.otlp_metrics.exporter import exponential_difference
    from otel_llm.processor.llm_metrics.metrics.exponential import ExponentialState

    first, later = [0.02, 0.021, 0.0, 0.5], [3.0, 90.0, 0.0, 0.02]
    before, after, only_later = ExponentialState(), ExponentialState(), ExponentialState()
    for value in first:
        before.observe(value)
        after.observe(value)
    for value in later:
        after.observe(value)
        only_later.observe(value)
    assert before.scale > after.scale  # the later values spread wider
    delta = exponential_difference(after, before)
    expected = only_later.fitted(160, after.scale)
    assert delta.scale == after.scale and delta.zero_count == 1
    assert {i: c for i, c in delta.positive.counts.items() if c} == \
        {i: c for i, c in expected.positive.counts.items() if c}
    assert sum(delta.positive.counts.values()) == 3
