"""The segment rules of DESIGN.md §4 as pure functions: exact intervals, TPOT, validation."""

from __future__ import annotations

import math

import pytest

from otel_llm.processor.llm_metrics.adapters.durations import parse_rust_duration
from otel_llm.pdata.observation import EngineKind, EngineObservation, MalformedSpan
from otel_llm.processor.llm_metrics.requests import adjusted_count
from otel_llm.processor.llm_metrics.segments import build_segments, derive_timings
from otel_llm.processor.llm_metrics.metrics.definitions import build_1_2_5_buckets, prometheus_metric_name

START = 1_700_000_000_000_000_000


def vllm(**kw) -> EngineObservation:
    base = dict(ttft_s=0.5, e2e_s=3.0, queue_s=0.2, prefill_s=0.25, decode_s=2.4, inference_s=2.65,
                completion_tokens=121)
    base.update(kw)
    return EngineObservation(EngineKind.VLLM, "vllm_v1", **base)


def test_vllm_v1_segments_are_exact():
    t = derive_timings(vllm(), 86400)
    segments = {s.name: (s.start_unix_ns - START, s.end_unix_ns - START) for s in build_segments(START, t)}
    # preprocess = T - Q - P = 0.05; queue 0.2; prefill 0.25 ends at T = 0.5; decode to 2.9; postprocess to 3.0.
    assert segments == {
        "preprocess": (0, 50_000_000),
        "queue": (50_000_000, 250_000_000),
        "prefill": (250_000_000, 500_000_000),
        "decode": (500_000_000, 2_900_000_000),
        "postprocess": (2_900_000_000, 3_000_000_000),
    }
    assert t.tpot_s == pytest.approx(2.4 / 120)


def test_zero_preprocess_and_postprocess_are_omitted():
    t = derive_timings(vllm(ttft_s=0.45, e2e_s=2.85), 86400)
    assert [s.name for s in build_segments(START, t)] == ["queue", "prefill", "decode"]


def test_tpot_is_zero_below_two_tokens_as_in_vllm():
    # vLLM's own definition (v1/metrics/stats.py): 0 for a request of at most one output token
    assert derive_timings(vllm(completion_tokens=1), 86400).tpot_s == 0.0
    assert derive_timings(vllm(completion_tokens=0), 86400).tpot_s == 0.0


@pytest.mark.parametrize(
    "kw,reason",
    [
        (dict(ttft_s=math.nan), "nan_latency"),
        (dict(decode_s=-1.0), "negative_latency"),
        (dict(e2e_s=math.inf), "infinite_latency"),
        (dict(e2e_s=1e9), "absurd_latency"),
        (dict(ttft_s=3.2), "inconsistent_latency"),  # TTFT after e2e: both the API server's, one clock
        (dict(completion_tokens=-3), "absurd_token_count"),
    ],
)
def test_bad_values_raise_with_reason(kw, reason):
    with pytest.raises(MalformedSpan) as info:
        derive_timings(vllm(**kw), 86400)
    assert info.value.reason == reason


def test_small_rounding_is_tolerated():
    t = derive_timings(vllm(decode_s=2.5004), 86400)  # 0.4 ms past e2e: engine rounding, not inconsistency
    assert t.postprocess_s == 0.0


@pytest.mark.parametrize("text,seconds", [("1.234567ms", 0.001234567), ("2.5s", 2.5), ("850µs", 0.00085),
                                          ("12ns", 1.2e-8), ("0ns", 0.0), ("3us", 3e-6)])
def test_rust_durations(text, seconds):
    assert parse_rust_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "fast", "1.2", "-3ms", "1e3s", "5 minutes"])
def test_rust_duration_garbage(text):
    with pytest.raises(ValueError):
        parse_rust_duration(text)


def test_token_buckets_follow_vllm():
    # research/engine-spans.md §2.1: 4096 -> up to 2000; 8192 adds 5000; 131072 ends 50000, 100000.
    assert build_1_2_5_buckets(4096) == (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)
    assert build_1_2_5_buckets(8192)[-1] == 5000
    assert build_1_2_5_buckets(131072)[-3:] == (20000, 50000, 100000)


@pytest.mark.parametrize("state,count", [("ot=th:0", 1.0), ("ot=th:8", 2.0), ("ot=th:c", 4.0),
                                         ("vendor=x,ot=rv:abcdef01234567;th:c", 4.0), ("", 1.0),
                                         ("ot=th:fffff", 2.0**20)])
def test_adjusted_count_from_threshold(state, count):
    assert adjusted_count(state) == pytest.approx(count)


@pytest.mark.parametrize("state,reason", [
    ("ot=th:zz", "invalid_sampling_threshold"), ("ot=th:-1", "invalid_sampling_threshold"),
    ("ot=th:1_0", "invalid_sampling_threshold"), ("ot=th:", "invalid_sampling_threshold"),
    ("ot=th:000000000000001", "invalid_sampling_threshold"),  # 15 digits
    ("ot=th:ffffffffffffff", "absurd_sampling_threshold"),  # a weight of 2^56
    ("ot=th:fffff1", "absurd_sampling_threshold"),  # just past one in a million
])
def test_unusable_thresholds_are_malformed(state, reason):
    with pytest.raises(MalformedSpan) as raised:
        adjusted_count(state)
    assert raised.value.reason == reason


def test_otlp_to_prometheus_names():
    assert prometheus_metric_name("gen_ai.server.time_to_first_token", "s") == "gen_ai_server_time_to_first_token_seconds"
    assert prometheus_metric_name("gen_ai.server.request.duration", "s") == "gen_ai_server_request_duration_seconds"
    assert prometheus_metric_name("gen_ai.client.token.usage", "{token}") == "gen_ai_client_token_usage"
