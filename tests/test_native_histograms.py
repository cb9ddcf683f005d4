"""Prometheus native histograms (``exporters.prometheus.native_histograms``), scraped by the real
Prometheus (Debian's 2.42: ``--enable-feature=native-histograms`` makes it ask for the protobuf
exposition and ingest the native parts; without the flag it scrapes text and keeps the classic
buckets).

Two real Prometheus servers scrape the same otel-llm: one with the feature (native), one without
(classic). For known TTFTs sent as vLLM V1 spans over OTLP/HTTP, ``histogram_quantile`` on the
native histogram must agree with ``histogram_quantile`` on the classic buckets within their error:

- The q-quantile's rank is ``q * count``; both estimates interpolate inside the bucket whose
  cumulative count first reaches the rank, and that bucket holds the rank-th smallest value ``v``
  (with ``count`` = 300 and q in {0.5, 0.9, 0.99} the rank is a whole number).
- Native bucket at schema ``s`` is ``(2**((i-1)/2**s), 2**(i/2**s)]``: it lies within
  ``[v / g, v * g]``, ``g = 2**(2**-s)``; the classic bucket is ``(le_prev, le]`` around ``v``.
- Hence native in ``[v/g, v*g]``, classic in ``(le_prev, le]`` and
  ``|native - classic| <= (le - le_prev) + v * (g - 1/g)``.

The values are fixed (seeded), no timing enters the bounds, and each query waits for the full count
first: nothing here can flake. ``s`` is computed here from the values (largest schema <= 8 whose
index range fits 160 buckets), never read from otel-llm.
"""

from __future__ import annotations

import math
import random
import urllib.request

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otel_llm.config import ConfigError, config_from_dict

from tests.support.otelllm import RunningServer
from tests.support.payloads import LATENCIES, vllm_batch
from tests.support.prometheus import PrometheusServer

COUNT = 300
FAMILY = "vllm:time_to_first_token_seconds"
PROTOBUF = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited"


def ttfts() -> list[float]:
    rng = random.Random(26)
    # Log-normal around 0.4 s, kept inside (0.005 s, 9 s]: below vLLM's top finite TTFT bucket, so
    # the classic estimate is never the +Inf bucket's.
    return [min(9.0, max(0.005, rng.lognormvariate(math.log(0.4), 0.9))) for _ in range(COUNT)]


def send(server: RunningServer, values: list[float]) -> None:
    request = ExportTraceServiceRequest()
    for value in values:
        # vLLM V1's latency attributes, consistent with each other: the payload's set scaled to the TTFT.
        scale = value / LATENCIES["time_to_first_token"]
        one = vllm_batch(1, model="m", latencies={k: v * scale for k, v in LATENCIES.items()})
        request.resource_spans.extend(one.resource_spans)
    http = urllib.request.Request(f"http://127.0.0.1:{server.http_port}/v1/traces",
                                  data=request.SerializeToString(),
                                  headers={"Content-Type": "application/x-protobuf"}, method="POST")
    with urllib.request.urlopen(http, timeout=30) as response:
        assert response.status == 200


def expected_schema(values: list[float], max_size: int = 160, max_schema: int = 8) -> int:
    for schema in range(max_schema, -5, -1):
        indexes = [math.ceil(math.log2(v) * 2**schema) for v in values]
        if max(indexes) - min(indexes) + 1 <= max_size:
            return schema
    raise AssertionError("no schema fits")


def scalar(result: list[dict]) -> float:
    assert len(result) == 1, result
    return float(result[0]["value"][1])


def test_native_histogram_quantiles_agree_with_the_classic_buckets(tmp_path, make_server):
    values = ttfts()
    server = make_server({"exporters": {"prometheus": {"native_histograms": True}},
                          "processors": {"tail_sampling": {"decision_wait": "1s", "grace": "100ms"}}})
    send(server, values)
    server.wait_until(lambda s: s.value(FAMILY + "_count") == COUNT and s.value("otel_llm_traces_in_memory") == 0,
                      timeout_s=60, what=f"{COUNT} TTFTs")
    # The exposition negotiates: protobuf to whoever prefers it, text as before to everyone else.
    with urllib.request.urlopen(urllib.request.Request(server.metrics_url + "/metrics",
                                                       headers={"Accept": PROTOBUF}), timeout=10) as response:
        assert response.headers["Content-Type"].startswith("application/vnd.google.protobuf")
        assert b"\n" not in response.read(1)  # a varint length, not a text line
    with urllib.request.urlopen(server.metrics_url + "/metrics", timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain")

    target = [server.metrics_url.split("://", 1)[1]]
    native = PrometheusServer(tmp_path / "native", target, features=["native-histograms"])
    classic = PrometheusServer(tmp_path / "classic", target)
    with native, classic:
        native.wait_for(f"histogram_count(sum({FAMILY}))", lambda r: r and scalar(r) == COUNT, timeout_s=60)
        classic.wait_for(f"sum({FAMILY}_count)", lambda r: r and scalar(r) == COUNT, timeout_s=60)
        # The native server ingested the native parts, not the classic series (Prometheus 2.42
        # prefers them); the classic one has no native histogram.
        assert native.query(f"{FAMILY}_bucket") == []
        assert classic.query(f"histogram_count({FAMILY})") == []
        les = sorted(float(s["metric"]["le"]) for s in classic.query(f"{FAMILY}_bucket"))
        schema = expected_schema(values)
        growth = 2 ** (2.0**-schema)
        # The schema Prometheus ingested: each native bucket's upper / lower bound is the growth factor.
        (series,) = native.query(FAMILY)
        buckets = series["histogram"][1]["buckets"]
        assert buckets and sum(float(b[3]) for b in buckets) == COUNT
        for _rule, low, high, _count in buckets:
            assert math.isclose(float(high) / float(low), growth, rel_tol=1e-9), (low, high, schema)
        ordered = sorted(values)
        lines = []
        for q in (0.5, 0.9, 0.99):
            rank = round(q * COUNT)
            v = ordered[rank - 1]
            upper = next(le for le in les if v <= le)
            lower = max([le for le in les if le < upper], default=0.0)
            n = scalar(native.query(f"histogram_quantile({q}, sum({FAMILY}))"))
            c = scalar(classic.query(f"histogram_quantile({q}, sum by (le) ({FAMILY}_bucket))"))
            assert v / growth <= n <= v * growth, (q, n, v, schema)
            assert lower <= c <= upper, (q, c, lower, upper)
            bound = (upper - lower) + v * (growth - 1 / growth)
            assert abs(n - c) <= bound, (q, n, c, bound)
            lines.append(f"p{round(q * 100)}: true {v:.4f}s native {n:.4f}s classic {c:.4f}s "
                         f"(|diff| {abs(n - c):.4f} <= {bound:.4f})")
    print(f"schema {schema}; " + "; ".join(lines))


def test_config_refuses_a_bucket_limit_without_native_histograms():
    with pytest.raises(ConfigError) as error:
        config_from_dict({"exporters": {"prometheus": {"native_histogram_max_buckets": 80}}})
    assert "exporters.prometheus.native_histogram_max_buckets" in str(error.value)
    with pytest.raises(ConfigError) as error:
        config_from_dict({"exporters": {"prometheus": {"native_histograms": True, "native_histogram_max_buckets": 1}}})
    assert "must be between 2 and 16384" in str(error.value)


def test_without_the_option_a_protobuf_scrape_gets_text(make_server):
    server = make_server()
    with urllib.request.urlopen(urllib.request.Request(server.metrics_url + "/metrics",
                                                       headers={"Accept": PROTOBUF}), timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain")


def test_the_protobuf_exposition_carries_every_sample_the_text_one_does(make_server):
    """Counters, gauges and histogram counts of the whole registry (the product's own telemetry
    included), value for value: what a Prometheus switching format would otherwise lose."""
    from google.protobuf.internal.decoder import _DecodeVarint  # the protobuf runtime's varint reader

    from otel_llm.exporter.prometheus.protobuf import MetricFamily

    server = make_server({"exporters": {"prometheus": {"native_histograms": True}},
                          "processors": {"tail_sampling": {"decision_wait": "1s", "grace": "100ms"}}})
    send(server, ttfts()[:20])
    text = server.wait_until(lambda s: s.value(FAMILY + "_count") == 20 and s.value("otel_llm_traces_in_memory") == 0,
                             timeout_s=60, what="20 TTFTs")
    with urllib.request.urlopen(urllib.request.Request(server.metrics_url + "/metrics",
                                                       headers={"Accept": PROTOBUF}), timeout=10) as response:
        body = response.read()
    samples: dict[tuple[str, frozenset], float] = {}
    position = 0
    while position < len(body):
        length, position = _DecodeVarint(body, position)
        family = MetricFamily.FromString(body[position:position + length])
        position += length
        for metric in family.metric:
            labels = frozenset((p.name, p.value) for p in metric.label)
            if metric.HasField("counter"):
                samples[(family.name, labels)] = metric.counter.value
            elif metric.HasField("gauge"):
                samples[(family.name, labels)] = metric.gauge.value
            elif metric.HasField("histogram"):
                samples[(family.name + "_count", labels)] = metric.histogram.sample_count
    expected = {(name, labels): value for (name, labels), value in text.samples.items()
                if not name.endswith(("_bucket", "_sum", "_created")) and "quantile" not in dict(labels)}
    missing = {k: v for k, v in expected.items() if k not in samples}
    assert not missing, sorted(missing)[:10]
    changed = {k: (v, samples[k]) for k, v in expected.items()
               if not k[0].startswith(("process_", "otel_llm_http", "python_")) and samples[k] != v}
    # Values move between two scrapes only for the process's own gauges; the span-derived ones are settled.
    assert all(not k[0].startswith(("vllm:", "gen_ai_", "otel_llm_request")) for k in changed), changed
    assert samples[(FAMILY + "_count", frozenset({("model_name", "m"), ("engine_kind", "vllm"),
                                                  ("service_name", "raw")}))] == 20
