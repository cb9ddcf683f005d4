"""A real Prometheus (Debian's package) scrapes otel-llm and answers the dashboards' quantile queries."""

from __future__ import annotations

import random
import time

import pytest

from otel_llm_simulate.emitters import RequestTiming, emit_vllm_v1, engine_tracer_provider
from tests.support.prometheus import PrometheusServer


def _send(server, provider, count: int, ttft_range: tuple[float, float], rng: random.Random) -> None:
    now = time.time_ns()
    for i in range(count):
        ttft = rng.uniform(*ttft_range)
        queue = ttft * 0.5
        prefill = ttft * 0.4
        timing = RequestTiming(now - 10**9, ttft - queue - prefill, queue, prefill, decode_s=1.0,
                               prompt_tokens=100, completion_tokens=101)
        emit_vllm_v1(provider, timing, request_id=f"r{i}")


@pytest.fixture
def prometheus(tmp_path, server):
    prom = PrometheusServer(tmp_path / "prom", [server.metrics_url.removeprefix("http://")], scrape_interval="1s")
    prom.start()
    yield prom
    prom.stop()


def test_histogram_quantile_over_rate_returns_the_expected_bucket(server, prometheus):
    rng = random.Random(3)
    provider = engine_tracer_provider("vllm-v1", server.exporter("grpc"), service_name="llama")
    # Phase 1: 60 slow requests (TTFT in (1, 2.5]), scraped before phase 2 starts.
    _send(server, provider, 60, (1.1, 2.4), rng)
    server.wait_for_requests(60)
    prometheus.wait_for("sum(vllm:time_to_first_token_seconds_count)", lambda r: r and float(r[0]["value"][1]) == 60)
    # Phase 2: 40 fast requests (TTFT in (0.25, 0.5]). Cumulatively the median is still slow; over the
    # rate window only phase 2 grows, so the rate-based median must land in (0.25, 0.5].
    _send(server, provider, 40, (0.26, 0.49), rng)
    server.wait_for_requests(100)
    prometheus.wait_for("sum(vllm:time_to_first_token_seconds_count)", lambda r: r and float(r[0]["value"][1]) == 100)

    for metric in ("vllm:time_to_first_token_seconds", "gen_ai_server_time_to_first_token_seconds"):
        cumulative = prometheus.query(f"histogram_quantile(0.5, sum by (le) ({metric}_bucket))")
        assert 1.0 < float(cumulative[0]["value"][1]) <= 2.5, metric
        result = prometheus.wait_for(
            f"histogram_quantile(0.5, sum by (le) (rate({metric}_bucket[1m])))",
            lambda r: bool(r) and r[0]["value"][1] not in ("NaN",),
        )
        median = float(result[0]["value"][1])
        assert 0.25 < median <= 0.5, f"{metric}: rate-based median {median} is not in the (0.25, 0.5] bucket"
    assert prometheus.targets_up()
