"""Label-keyed histogram and counter state: plain arrays, ~5x cheaper than prometheus_client children.

Exposition goes through prometheus_client's own ``Metric`` types (see ``exposition.py``).
Each family caps its series; past the cap, new label sets share one overflow series. The cap
counts bytes too: every family of a recorder draws on one ``SeriesBudget``, the estimated size of
the exposition its series make (each sample line repeats the series' labels), so the size of
``/metrics`` and the time a scrape takes stay bounded whatever label values clients send.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from otel_llm.processor.llm_metrics.metrics.exponential import ExponentialState

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
    # The same observations in base-2 exponential buckets, kept only when an exporter asks for them.
    exponential: ExponentialState | None = None


class SeriesBudget:
    """Bytes of exposition that the series of every family together may take (an estimate that
    errs high: the longest label names, the longest numbers, an exemplar on every bucket)."""

    __slots__ = ("limit", "used")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self, cost: int) -> bool:
        if self.used + cost > self.limit:
            return False
        self.used += cost
        return True


_LABEL_OVERHEAD = 40  # a label's name when the family is not told its names, '=""' and ','
_LINE_OVERHEAD = 16 + 8 + 30  # a name's suffix and translation, le="...", the value and separators
_EXEMPLAR = 110  # OpenMetrics: ' # {trace_id="<32>",span_id="<16>"} <value> <timestamp>'


class Family(Generic[V]):
    """Series keyed by label values, capped at ``limit`` distinct keys plus one overflow series,
    and by ``budget`` (shared by a recorder's families) in bytes of exposition."""

    __slots__ = ("name", "limit", "series", "overflowed", "budget", "_lines", "_line_bytes", "_label_names_bytes")

    OVERFLOW: Key = ("__overflow__",)

    def __init__(self, name: str, limit: int, budget: SeriesBudget | None = None, lines: int = 1,
                 exemplars: bool = False, label_names: tuple[str, ...] | None = None) -> None:
        self.name = name
        self.limit = limit
        self.series: dict[Key, V] = {}
        self.overflowed = 0
        self.budget = budget
        self._lines = lines  # sample lines per series
        self._line_bytes = len(name) + _LINE_OVERHEAD + (_EXEMPLAR if exemplars else 0)
        # Each label's name, '=""' and ','; unknown names are assumed long.
        self._label_names_bytes = sum(len(n) + 4 for n in label_names) if label_names is not None else -1

    def has_room(self, key: Key) -> bool:
        """Whether a new series ``key`` fits under the cap and the byte budget (which it then takes)."""
        if len(self.series) >= self.limit:
            return False
        if self.budget is None:
            return True
        label_bytes = self._label_names_bytes if self._label_names_bytes >= 0 else _LABEL_OVERHEAD * len(key)
        for value in key:  # as exposed: UTF-8, with \\, \" and \n escaped
            label_bytes += (len(value.encode("utf-8", "replace")) + value.count("\\") + value.count('"')
                            + value.count("\n"))
        return self.budget.take(self._lines * (self._line_bytes + label_bytes))

    def _admit(self, key: Key) -> Key:
        if key in self.series or self.has_room(key):
            return key
        self.overflowed += 1
        return self.OVERFLOW


class HistogramFamily(Family[HistogramSeries]):
    __slots__ = ("bounds", "bounds_by_model", "exponential", "series_class")

    def __init__(self, name: str, bounds: tuple[float, ...], limit: int, budget: SeriesBudget | None = None,
                 label_names: tuple[str, ...] | None = None,
                 bounds_by_model: dict[str, tuple[float, ...]] | None = None) -> None:
        # A bucket line per bound and +Inf, then _count and _sum (those two without an exemplar).
        super().__init__(name, limit, budget, len(bounds) + 3, exemplars=True, label_names=label_names)
        self.bounds = bounds
        # A series whose first label (the model) is here gets these bounds (vLLM's token buckets
        # follow each model's max_model_len).
        self.bounds_by_model = bounds_by_model or {}
        # (max_size, max_scale) of the exponential state each new series keeps; None: none kept.
        self.exponential: tuple[int, int] | None = None
        # The compiled core's series (its recorder's observers write those, buckets as Rust numbers),
        # or None: this module's.
        self.series_class: Any = None

    def new_series(self, key: Key) -> HistogramSeries:
        own = self.bounds_by_model.get(key[0], ()) if self.bounds_by_model and key else ()
        exponential = ExponentialState(*self.exponential) if self.exponential else None
        if self.series_class is not None:
            series: HistogramSeries = self.series_class(len(own or self.bounds) + 1, own, exponential)
            return series
        return HistogramSeries([0.0] * (len(own or self.bounds) + 1), bounds=own, exponential=exponential)


class CounterFamily(Family[Any]):
    """Counter series: floats, or with the compiled core the core's ``CounterSeries`` cells its
    observers add to in place (``cell_class``); ``totals()`` reads either as floats."""

    __slots__ = ("cell_class",)

    def __init__(self, name: str, limit: int, budget: SeriesBudget | None = None,
                 label_names: tuple[str, ...] | None = None) -> None:
        super().__init__(name, limit, budget, label_names=label_names)
        self.cell_class: Any = None

    def add(self, key: Key, amount: float) -> None:
        current = self.series.get(key)
        if current is None:
            key = self._admit(key)
            current = self.series.get(key)
        self._add(key, current, amount)

    def add_overflow(self, amount: float) -> None:
        """``amount`` on the overflow series (a label value too long for a series of its own), counted."""
        self.overflowed += 1
        self._add(self.OVERFLOW, self.series.get(self.OVERFLOW), amount)

    def _add(self, key: Key, current: Any, amount: float) -> None:
        if self.cell_class is None:
            self.series[key] = (0.0 if current is None else current) + amount
            return
        if current is None:
            current = self.series[key] = self.cell_class()
        current.add(amount)

    def totals(self) -> dict[Key, float]:
        """Each series' total, as a float (a copy: exposition and push read this)."""
        if self.cell_class is None:
            return dict(self.series)
        return {key: float(cell) for key, cell in self.series.items()}
