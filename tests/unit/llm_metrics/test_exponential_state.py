"""The recorder's exponential state against opentelemetry-sdk's own Base2 Exponential Bucket
Histogram Aggregation (a MeterProvider, a View, an InMemoryMetricReader: the SDK's public API), and
its fast index against the SDK mappings it stands in for."""

from __future__ import annotations

import math
import random

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.metrics.view import ExponentialBucketHistogramAggregation, View

from otel_llm.processor.llm_metrics.metrics.exponential import ExponentialState, fast_index, mapping_of


def sdk_point(values: list[float], max_size: int, max_scale: int):
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader], views=[
        View(instrument_name="h", aggregation=ExponentialBucketHistogramAggregation(max_size, max_scale))])
    histogram = provider.get_meter("test").create_histogram("h")
    for value in values:
        histogram.record(value)
    (point,) = reader.get_metrics_data().resource_metrics[0].scope_metrics[0].metrics[0].data.data_points
    provider.shutdown()
    return point


def trimmed(offset: int, counts) -> dict[int, int]:
    return {offset + i: int(c) for i, c in enumerate(counts) if c}


@pytest.mark.parametrize("seed,max_size,max_scale,spread", [
    (1, 160, 20, 1.0), (2, 160, 20, 4.0), (3, 40, 12, 2.0), (4, 160, 8, 0.3), (5, 8, 20, 6.0), (6, 160, 0, 3.0)])
def test_state_matches_the_sdk_aggregation(seed, max_size, max_scale, spread):
    rng = random.Random(seed)
    values = [rng.lognormvariate(-1.0, spread) for _ in range(2000)] + [0.0, 0.0, 1.0, 2.0, 0.5, 1024.0]
    state = ExponentialState(max_size, max_scale)
    for value in values:
        state.observe(value)
    point = sdk_point(values, max_size, max_scale)
    assert state.scale == point.scale
    assert state.zero_count == point.zero_count == 2
    offset, counts = state.positive.dense()
    assert trimmed(offset, counts) == trimmed(point.positive.offset, point.positive.bucket_counts)
    assert len(counts) <= max_size


def test_fast_index_is_the_sdk_mapping():
    rng = random.Random(7)
    values = [math.exp(rng.uniform(-690, 690)) for _ in range(3000)]
    values += [2.0**k for k in range(-1070, 1024, 7)]  # powers of two: bucket upper bounds
    values += [math.nextafter(2.0**k, math.inf) for k in range(-1000, 1000, 13)]
    values += [math.nextafter(2.0**k, 0.0) for k in range(-1000, 1000, 13)]
    values += [5e-324, 1e-310, 2.2250738585072014e-308, 1.7976931348623157e308]  # subnormal, extremes
    for scale in range(-10, 21):
        mapping = mapping_of(scale)
        factor = math.ldexp(1 / math.log(2), scale)
        for value in values:
            assert fast_index(value, scale, factor, mapping) == mapping.map_to_index(value), (scale, value)


def test_weighted_counts_become_integers_that_add_up_to_the_rounded_total():
    """Sampled spans weigh 1.6 each: three per bucket rounded one by one give 2 + 2 + 2 = 6 > 5, a
    point whose buckets hold more than its count (OTLP forbids it, Prometheus refuses the native
    histogram). Rounded on the running total they give 5, each bucket within 1 of its weight."""
    from otel_llm.processor.llm_metrics.metrics.exponential import whole_counts

    weights = [1.6, 1.6, 1.6]
    assert sum(round(w) for w in weights) == 6
    zero, negative, positive = whole_counts(0.0, [], weights)
    assert (zero, negative) == (0, []) and sum(positive) == 5
    assert all(abs(whole - weight) < 1 for whole, weight in zip(positive, weights))
    zero, negative, positive = whole_counts(0.7, [1.6, 0.2], [0.3, 2.9])
    assert zero + sum(negative) + sum(positive) == round(0.7 + 1.6 + 0.2 + 0.3 + 2.9)
    assert min([zero, *negative, *positive]) >= 0
