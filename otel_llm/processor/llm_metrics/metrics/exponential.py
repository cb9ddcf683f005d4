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


class ExponentialBuckets:
    """One sign's buckets: counts by index (sparse), and their index range."""

    __slots__ = ("counts", "low", "high")

    def __init__(self) -> None:
        self.counts: dict[int, float] = {}
        self.low = 0
        self.high = -1  # empty

    def add(self, index: int, weight: float) -> None:
        if self.high < self.low:
            self.low = self.high = index
        elif index < self.low:
            self.low = index
        elif index > self.high:
            self.high = index
        self.counts[index] = self.counts.get(index, 0.0) + weight

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
    __slots__ = ("max_size", "scale", "zero_count", "positive", "negative", "_mapping")

    def __init__(self, max_size: int = DEFAULT_MAX_SIZE, max_scale: int = DEFAULT_MAX_SCALE) -> None:
        self.max_size = max_size
        self.scale = max_scale
        self.zero_count = 0.0
        self.positive = ExponentialBuckets()
        self.negative = ExponentialBuckets()
        self._mapping = mapping_of(max_scale)

    def observe(self, value: float, weight: float = 1.0) -> None:
        if value == 0:
            self.zero_count += weight
            return
        buckets = self.positive if value > 0 else self.negative
        index = self._mapping.map_to_index(abs(value))
        if buckets.counts:
            change = change_to_fit(min(buckets.low, index), max(buckets.high, index), self.max_size)
            if change:
                index >>= self.downscale(change)
        buckets.add(index, weight)

    def downscale(self, change: int) -> int:
        """Merge buckets to ``scale - change`` (never below ``MIN_SCALE``); returns the change made."""
        change = max(0, min(change, self.scale - MIN_SCALE))
        if change:
            self.positive.downscale(change)
            self.negative.downscale(change)
            self.scale -= change
            self._mapping = mapping_of(self.scale)
        return change

    def copy(self) -> ExponentialState:
        out = ExponentialState.__new__(ExponentialState)
        out.max_size, out.scale, out.zero_count = self.max_size, self.scale, self.zero_count
        out.positive, out.negative = self.positive.copy(), self.negative.copy()
        out._mapping = self._mapping
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
