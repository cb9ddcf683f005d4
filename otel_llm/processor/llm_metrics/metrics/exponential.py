"""Base-2 exponential histogram state, one per series where exponential histograms are asked for.

The OTel data model's exponential histogram (spec ``metrics/data-model.md`` "ExponentialHistogram",
aggregation ``metrics/sdk.md`` "Base2 Exponential Bucket Histogram Aggregation": ``MaxSize`` 160 and
``MaxScale`` 20 by default): bucket ``index`` at ``scale`` holds the values in
``(base**index, base**(index+1)]`` with ``base = 2**(2**-scale)``. The value -> index mapping is
opentelemetry-sdk's own (``LogarithmMapping`` for scale > 0, ``ExponentMapping`` for scale <= 0, the
code its ``ExponentialBucketHistogramAggregation`` uses); the state starts at ``max_scale`` and
downscales, exactly, just enough to keep each sign's buckets within ``max_size``. Values equal to 0
go to ``zero_count`` (zero threshold 0). Prometheus native histograms use the same buckets: their
``schema`` is this ``scale`` (Prometheus accepts -4 .. 8, so a state above 8 is downscaled for them).
"""

from __future__ import annotations

from math import floor, frexp, ldexp, log

from opentelemetry.sdk.metrics._internal.exponential_histogram.mapping import Mapping
from opentelemetry.sdk.metrics._internal.exponential_histogram.mapping.exponent_mapping import ExponentMapping
from opentelemetry.sdk.metrics._internal.exponential_histogram.mapping.logarithm_mapping import LogarithmMapping

DEFAULT_MAX_SIZE = 160  # spec metrics/sdk.md, Base2 Exponential Bucket Histogram Aggregation
DEFAULT_MAX_SCALE = 20
MIN_SCALE = -10  # ExponentMapping's smallest scale: every float64 in at most 2 buckets
MAX_SCALE = 20  # LogarithmMapping's largest
MIN_MAX_SIZE, MAX_MAX_SIZE = 2, 16384  # the SDK aggregation's bounds on max_size


def mapping_of(scale: int) -> Mapping:
    return LogarithmMapping(scale) if scale > 0 else ExponentMapping(scale)


# The SDK mappings' own arithmetic, for the normal floats latencies and token counts are, without
# their struct-based IEEE 754 field reads (~5x the cost); anything else goes to the SDK mapping.
# ``frexp(v) = (m, e)`` with ``m`` in [0.5, 1): the IEEE exponent is ``e - 1`` and the mantissa
# bits are all zero exactly when ``m == 0.5`` (tests/unit/test_exponential_mapping.py compares both).
_MIN_NORMAL = 2.2250738585072014e-308
_MAX_FAST = 2.0**1000  # below the top buckets LogarithmMapping clamps


def fast_index(value: float, scale: int, scale_factor: float, mapping: Mapping) -> int:
    """``mapping.map_to_index(value)`` for ``value > 0``."""
    if not _MIN_NORMAL < value < _MAX_FAST:
        return mapping.map_to_index(value)
    mantissa, exponent = frexp(value)
    if scale > 0:
        if mantissa == 0.5:  # an exact power of two: the upper bound of its bucket
            return ((exponent - 1) << scale) - 1
        return floor(log(value) * scale_factor)
    return (exponent - 1 - (mantissa == 0.5)) >> -scale


class ExponentialBuckets:
    """One sign's buckets: counts by index (sparse), and their index range."""

    __slots__ = ("counts", "low", "high")

    def __init__(self) -> None:
        self.counts: dict[int, float] = {}
        self.low = 0
        self.high = -1  # empty

    def downscale(self, change: int) -> None:
        if change <= 0 or not self.counts:
            return
        merged: dict[int, float] = {}
        for index, count in self.counts.items():
            merged[index >> change] = merged.get(index >> change, 0.0) + count
        self.counts = merged
        self.low >>= change
        self.high >>= change

    def dense(self) -> tuple[int, list[float]]:
        """(offset, counts from ``offset`` on), as OTLP and Prometheus carry them."""
        if not self.counts:
            return 0, []
        return self.low, [self.counts.get(i, 0.0) for i in range(self.low, self.high + 1)]

    def copy(self) -> ExponentialBuckets:
        out = ExponentialBuckets()
        out.counts, out.low, out.high = dict(self.counts), self.low, self.high
        return out


def change_to_fit(low: int, high: int, max_size: int) -> int:
    """The smallest downscale after which the indexes ``low .. high`` take at most ``max_size`` buckets."""
    change = 0
    while (high >> change) - (low >> change) + 1 > max_size:
        change += 1
    return change


class ExponentialState:
    __slots__ = ("max_size", "scale", "zero_count", "positive", "negative", "_mapping", "_scale_factor")

    def __init__(self, max_size: int = DEFAULT_MAX_SIZE, max_scale: int = DEFAULT_MAX_SCALE) -> None:
        self.max_size = max_size
        self.scale = max_scale
        self.zero_count = 0.0
        self.positive = ExponentialBuckets()
        self.negative = ExponentialBuckets()
        self._mapping = mapping_of(max_scale)
        self._scale_factor = ldexp(1 / log(2), max_scale)

    def observe(self, value: float, weight: float = 1.0) -> None:
        if value > 0:
            buckets = self.positive
        elif value < 0:
            buckets = self.negative
            value = -value
        else:
            self.zero_count += weight
            return
        # fast_index, inlined (one call less per observation on the recording path)
        scale = self.scale
        if _MIN_NORMAL < value < _MAX_FAST:
            mantissa, exponent = frexp(value)
            if scale > 0:
                index = ((exponent - 1) << scale) - 1 if mantissa == 0.5 else floor(log(value) * self._scale_factor)
            else:
                index = (exponent - 1 - (mantissa == 0.5)) >> -scale
        else:
            index = self._mapping.map_to_index(value)
        if not buckets.counts:
            buckets.low = buckets.high = index
        elif index < buckets.low or index > buckets.high:
            low, high = min(buckets.low, index), max(buckets.high, index)
            if high - low + 1 > self.max_size:
                index >>= self.downscale(change_to_fit(low, high, self.max_size))
            if index < buckets.low:
                buckets.low = index
            elif index > buckets.high:
                buckets.high = index
        counts = buckets.counts
        counts[index] = counts.get(index, 0.0) + weight

    def downscale(self, change: int) -> int:
        """Merge buckets to ``scale - change`` (never below ``MIN_SCALE``); returns the change made."""
        change = max(0, min(change, self.scale - MIN_SCALE))
        if change:
            self.positive.downscale(change)
            self.negative.downscale(change)
            self.scale -= change
            self._mapping = mapping_of(self.scale)
            self._scale_factor = ldexp(1 / log(2), self.scale)
        return change

    def copy(self) -> ExponentialState:
        out = ExponentialState.__new__(ExponentialState)
        out.max_size, out.scale, out.zero_count = self.max_size, self.scale, self.zero_count
        out.positive, out.negative = self.positive.copy(), self.negative.copy()
        out._mapping, out._scale_factor = self._mapping, self._scale_factor
        return out

    def fitted(self, max_size: int, max_scale: int) -> ExponentialState:
        """A copy downscaled to ``max_scale`` and to ``max_size`` buckets per sign: what a state built
        with those limits from the same values holds (downscaling merges whole buckets exactly)."""
        out = self.copy()
        change = max(0, out.scale - max_scale)
        for buckets in (out.positive, out.negative):
            if buckets.counts:
                change = max(change, change_to_fit(buckets.low, buckets.high, max_size))
        out.downscale(change)
        out.max_size = max_size
        return out


def whole_counts(zero: float, negative: list[float], positive: list[float]) -> tuple[int, list[int], list[int]]:
    """The zero, negative and positive bucket counts as integers whose sum is the rounded total.

    Counts are weighted (a sampled span's adjusted count can be 1.45): rounding each bucket on its
    own can make the buckets add up to more than the point's count, which OTLP forbids and Prometheus
    refuses for a native histogram. Rounding the running total instead keeps every bucket within 1 of
    its weight and the sum exact."""
    running = 0.0
    previous = 0

    def take(value: float) -> int:
        nonlocal running, previous
        running += value
        now = int(round(running))
        whole, previous = max(0, now - previous), max(previous, now)
        return whole

    zero_whole = take(zero)
    negative_whole = [take(c) for c in negative]
    positive_whole = [take(c) for c in positive]
    return zero_whole, negative_whole, positive_whole
