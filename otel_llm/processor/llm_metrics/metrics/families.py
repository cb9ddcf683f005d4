"""Label-keyed histogram and counter state: plain arrays, ~5x cheaper than prometheus_client children.

Exposition goes through prometheus_client's own ``Metric`` types (see ``exposition.py``).
Each family caps its series; past the cap, new label sets share one overflow series.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Generic, TypeVar

Key = tuple[str, ...]
V = TypeVar("V")  # a series' state: HistogramSeries, or a counter's float


@dataclass(slots=True, frozen=True)
class Exemplar:
    trace_id: str
    span_id: str
    value: float
    timestamp: float


@dataclass(slots=True)
class HistogramSeries:
    counts: list[float]  # per bucket, not cumulative; last slot is +Inf
    total: float = 0.0
    count: float = 0.0
    exemplars: dict[int, Exemplar] = field(default_factory=dict)
    # Its own upper bounds where they differ from the family's (a model's max_model_len); () = the family's.
    bounds: tuple[float, ...] = ()


class Family(Generic[V]):
    """Series keyed by label values, capped at ``limit`` distinct keys plus one overflow series."""

    __slots__ = ("name", "limit", "series", "overflowed")

    OVERFLOW: Key = ("__overflow__",)

    def __init__(self, name: str, limit: int) -> None:
        self.name = name
        self.limit = limit
        self.series: dict[Key, V] = {}
        self.overflowed = 0

    def _admit(self, key: Key) -> Key:
        if key in self.series or len(self.series) < self.limit:
            return key
        self.overflowed += 1
        return self.OVERFLOW


class HistogramFamily(Family[HistogramSeries]):
    __slots__ = ("bounds", "bounds_by_model")

    def __init__(self, name: str, bounds: tuple[float, ...], limit: int,
                 bounds_by_model: dict[str, tuple[float, ...]] | None = None) -> None:
        super().__init__(name, limit)
        self.bounds = bounds
        # A series whose first label (the model) is here gets these bounds (vLLM's token buckets
        # follow each model's max_model_len).
        self.bounds_by_model = bounds_by_model or {}

    def new_series(self, key: Key) -> HistogramSeries:
        own = self.bounds_by_model.get(key[0], ()) if self.bounds_by_model and key else ()
        return HistogramSeries([0.0] * (len(own or self.bounds) + 1), bounds=own)

    def observe(self, key: Key, value: float, weight: float = 1.0, exemplar: Exemplar | None = None) -> None:
        series = self.series.get(key)
        if series is None:
            key = self._admit(key)
            series = self.series.get(key)
            if series is None:
                series = self.series[key] = self.new_series(key)
        index = bisect_left(series.bounds or self.bounds, value)  # le semantics: value == bound falls in that bucket
        series.counts[index] += weight
        series.total += value * weight
        series.count += weight
        if exemplar is not None:
            series.exemplars[index] = exemplar


class CounterFamily(Family[float]):
    __slots__ = ()

    def add(self, key: Key, amount: float) -> None:
        current = self.series.get(key)
        if current is None:
            key = self._admit(key)
            current = self.series.get(key, 0.0)
        self.series[key] = current + amount
