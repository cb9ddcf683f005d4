"""Prometheus' ``histogram_quantile`` for classic (``le``) buckets, line for line as
``promql/quantile.go`` ``bucketQuantile`` (v2.x): buckets sorted by upper bound, equal bounds
merged, counts made monotonic, then linear interpolation inside the bucket that holds the rank.
The overview computes every percentile with it from merged bucket counts, so its numbers equal
``histogram_quantile(q, sum by (le, ...) (...))`` on the same samples; percentiles are never averaged."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence


def histogram_quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float:
    """``buckets``: (upper bound, cumulative count) pairs, ``+Inf`` included. NaN when there is
    nothing to say (no observations, no ``+Inf`` bucket, fewer than two buckets)."""
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    ordered = sorted(buckets, key=lambda b: b[0])
    if not ordered or not math.isinf(ordered[-1][0]) or ordered[-1][0] < 0:
        return math.nan
    merged: list[list[float]] = []
    for bound, count in ordered:  # coalesceBuckets
        if merged and merged[-1][0] == bound:
            merged[-1][1] += count
        else:
            merged.append([bound, count])
    highest = -math.inf  # ensureMonotonic
    for bucket in merged:
        if bucket[1] > highest:
            highest = bucket[1]
        elif bucket[1] < highest:
            bucket[1] = highest
    if len(merged) < 2:
        return math.nan
    observations = merged[-1][1]
    if observations == 0:
        return math.nan
    rank = q * observations
    b = next((i for i in range(len(merged) - 1) if merged[i][1] >= rank), len(merged) - 1)
    if b == len(merged) - 1:
        return merged[-2][0]
    if b == 0 and merged[0][0] <= 0:
        return merged[0][0]
    start, end, count = 0.0, merged[b][0], merged[b][1]
    if b > 0:
        start = merged[b - 1][0]
        count -= merged[b - 1][1]
        rank -= merged[b - 1][1]
    return start + (end - start) * (rank / count)


def quantile_of_counts(q: float, bounds: Sequence[float], counts: Sequence[float]) -> float:
    return histogram_quantile(q, zip(bounds, counts))
