"""Records each request once, in every enabled naming, from the same ``RequestRecord``."""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from dataclasses import dataclass
from typing import Any

from otel_llm.pdata.records import RequestRecord
from otel_llm.processor.llm_metrics.metrics.accounting import Accounting
from otel_llm.processor.llm_metrics.metrics.definitions import (
    SEGMENT_METRIC,
    CounterSpec,
    HistogramSpec,
    Naming,
    prometheus_label_name,
)
from otel_llm.processor.llm_metrics.metrics.families import (
    CounterFamily,
    Exemplar,
    HistogramFamily,
    HistogramSeries,
    Key,
    SeriesBudget,
)

DEFAULT_SERIES_LIMIT_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_LABEL_VALUE_BYTES = 256


@dataclass(slots=True)
class _BoundHistogram:
    spec: HistogramSpec
    family: HistogramFamily
    key_suffix: Key  # the spec's fixed label value, if it has one


@dataclass(slots=True)
class _BoundCounter:
    spec: CounterSpec
    family: CounterFamily
    key_suffix: Key = ()  # the spec's fixed label value, if it has one

    @property
    def extra_label_names(self) -> tuple[str, ...]:
        """Its label names after the naming's: the fixed label's, then ``finished_reason``."""
        return ((self.spec.fixed_label[0],) if self.spec.fixed_label else ()) + (
            ("finished_reason",) if self.spec.by_outcome else ())


@dataclass(slots=True)
class ExposedHistogram:
    """One histogram family as exposed: several specs may observe into it (``fixed_label``)."""

    spec: HistogramSpec  # the first of them: name, unit, description, buckets
    family: HistogramFamily
    label_names: tuple[str, ...]


@dataclass(slots=True)
class BoundNaming:
    naming: Naming
    label_names: tuple[str, ...]  # naming labels + configured dimensions
    histograms: list[_BoundHistogram]
    counters: list[_BoundCounter]
    exposed: list[ExposedHistogram]


def _bind(naming: Naming, dimension_names: tuple[str, ...], series_limit: int, budget: SeriesBudget) -> BoundNaming:
    label_names = naming.label_names + dimension_names
    exposed: dict[str, ExposedHistogram] = {}
    histograms = []
    for spec in naming.histograms:
        shared = exposed.get(spec.name)
        if shared is None:
            extra = (spec.fixed_label[0],) if spec.fixed_label else ()
            exposed_labels = tuple(prometheus_label_name(n) for n in label_names + extra) + ("le",)
            shared = exposed[spec.name] = ExposedHistogram(
                spec, HistogramFamily(spec.name, spec.buckets, series_limit, budget, exposed_labels,
                                      dict(spec.buckets_by_model)),
                label_names + extra)
        histograms.append(_BoundHistogram(spec, shared.family, (spec.fixed_label[1],) if spec.fixed_label else ()))
    counter_labels = tuple(prometheus_label_name(n) for n in label_names) + ("finished_reason",)
    counters = [_BoundCounter(c, CounterFamily(c.name, series_limit, budget, label_names=counter_labels + (
                    (prometheus_label_name(c.fixed_label[0]),) if c.fixed_label else ())),
                              (c.fixed_label[1],) if c.fixed_label else ())
                for c in naming.counters]
    return BoundNaming(naming, label_names, histograms, counters, list(exposed.values()))


class _Plan:
    """One naming's observations, resolved for the recording loop: per histogram (value, success
    only, per step, bounds, family, fixed label value), per counter (value, by outcome, family), and
    a cache from a record's label key to the series each histogram observes into (``None`` until its
    first observation, so a series exists only once observed, as before)."""

    __slots__ = ("bound", "labels", "label_names", "hists", "counters", "cache", "cache_limit")

    def __init__(self, bound: BoundNaming, series_limit: int) -> None:
        self.bound = bound
        self.labels = bound.naming.labels
        self.label_names = tuple(prometheus_label_name(n) for n in bound.label_names)
        self.hists = tuple((h.spec.value, h.spec.success_only, h.spec.per_step, h.family.bounds, h.family,
                            h.key_suffix) for h in bound.histograms)
        self.counters = tuple((c.spec.value, c.spec.by_outcome, c.family, c.key_suffix) for c in bound.counters)
        # Per key: the series of each histogram (None until first observed), then whether each is
        # the overflow series, then the name of a label whose value is too long ("" if none).
        self.cache: dict[Key, list[Any]] = {}
        # The cache only saves lookups: bounded whatever the label keys (a hostile flood clears it).
        self.cache_limit = 4 * series_limit + 64


def _series_of(family: HistogramFamily, key: Key) -> HistogramSeries:
    """The series ``key`` observes into: its own, or the overflow series once the cap is full (the
    caller counts each observation that goes there in ``family.overflowed``)."""
    series = family.series.get(key)
    if series is None:
        if key != family.OVERFLOW and not family.has_room(key):
            key = family.OVERFLOW
        series = family.series.get(key)
        if series is None:
            series = family.series[key] = family.new_series(key)
    return series


def _too_long(key: Key, names: tuple[str, ...], limit: int) -> str:
    """The name of the first label whose value has more than ``limit`` bytes (UTF-8), or ""."""
    for position, value in enumerate(key):
        if len(value) > limit // 4 and len(value.encode("utf-8", "replace")) > limit:
            return names[position] if position < len(names) else "dimension"
    return ""


class MetricsRecorder:
    def __init__(self, namings: list[Naming], dimension_names: tuple[str, ...], series_limit: int,
                 series_limit_bytes: int = DEFAULT_SERIES_LIMIT_BYTES,
                 max_label_value_bytes: int = DEFAULT_MAX_LABEL_VALUE_BYTES) -> None:
        """``series_limit`` label sets per family and ``series_limit_bytes`` of exposition over all
        families; a label value over ``max_label_value_bytes`` never takes a series of its own: its
        observations go to the overflow series, counted in ``too_long`` by label."""
        self.dimension_names = dimension_names
        self.budget = SeriesBudget(series_limit_bytes)
        self.max_label_value_bytes = max_label_value_bytes
        self.too_long: dict[str, int] = {}
        self.namings = [_bind(naming, dimension_names, series_limit, self.budget) for naming in namings]
        self._by_side: dict[str, list[BoundNaming]] = {}
        self._plans: dict[str, tuple[_Plan, ...]] = {}
        for bound in self.namings:
            self._by_side.setdefault(bound.naming.side, []).append(bound)
        for side, bounds in self._by_side.items():
            self._plans[side] = tuple(_Plan(bound, series_limit) for bound in bounds)
        self.segment_label_names = ("model_name", "engine_kind", "service_name", "segment") + dimension_names
        self.segments = HistogramFamily(SEGMENT_METRIC.name, SEGMENT_METRIC.buckets, series_limit, self.budget,
                                        self.segment_label_names + ("le",))
        self._segment_cache: dict[Key, dict[str, tuple[HistogramSeries, bool]]] = {}
        self._segment_cache_limit = 4 * series_limit + 64
        self._segment_too_long: dict[Key, str] = {}
        self.lock = threading.Lock()
        self.requests_recorded = 0
        self.accounting: Accounting | None = None  # tenant tokens, cost, SLO attainment (when configured)
        # Bucket limit of the native histogram parts a scrape gets (``exporters.prometheus.native_histograms``
        # sets it with ``keep_exponential``); None: a scrape copies none.
        self.native_max_size: int | None = None

    def record(self, record: RequestRecord, with_exemplars: bool = False) -> None:
        """Observe ``record`` in every naming of its side; ``with_exemplars`` only for traces the sampler kept.

        One loop for every naming: a label key is built once per naming and record, the series it
        observes into are looked up once per key (``_Plan.cache``), and an observation is a bucket
        index by ``bisect`` and three additions (``HistogramFamily.observe``'s arithmetic, inlined)."""
        weight = record.weight
        succeeded = record.succeeded
        trace_id = record.trace_id.hex() if with_exemplars else ""
        span_id = record.span_id.hex() if with_exemplars else ""
        now = time.time() if with_exemplars else 0.0
        dimensions = record.dimensions
        too_long = ""
        with self.lock:
            self.requests_recorded += 1
            for plan in self._plans.get(record.side, ()):
                key: Key = plan.labels(record) + dimensions
                slots = plan.cache.get(key)
                if slots is None:
                    if len(plan.cache) >= plan.cache_limit:
                        plan.cache.clear()
                    slots = plan.cache[key] = self._slots(plan, key)
                count = len(plan.hists)
                if slots[-1]:
                    too_long = too_long or slots[-1]
                    key = CounterFamily.OVERFLOW
                position = -1
                for value_of, success_only, per_step, bounds, family, suffix in plan.hists:
                    position += 1
                    if success_only and not succeeded:
                        continue
                    if per_step is None:
                        value = value_of(record)
                        if value is None:
                            continue
                        series = slots[position]
                        if series is None:
                            series = self._resolve(slots, position, count, family, key + suffix if suffix else key)
                        # le semantics: value == bound falls in that bucket
                        index = bisect_left(series.bounds or bounds, value)
                        series.counts[index] += weight
                        series.total += value * weight
                        series.count += weight
                        if series.exponential is not None:
                            series.exponential.observe(value, weight)
                        if slots[count + position]:
                            family.overflowed += 1
                        if with_exemplars:
                            series.exemplars[index] = Exemplar(trace_id, span_id, value, now)
                        continue
                    for value in per_step(record):
                        series = slots[position]
                        if series is None:
                            series = self._resolve(slots, position, count, family, key + suffix if suffix else key)
                        index = bisect_left(series.bounds or bounds, value)
                        series.counts[index] += weight
                        series.total += value * weight
                        series.count += weight
                        if series.exponential is not None:
                            series.exponential.observe(value, weight)
                        if slots[count + position]:
                            family.overflowed += 1
                        if with_exemplars:
                            series.exemplars[index] = Exemplar(trace_id, span_id, value, now)
                for value_of, by_outcome, counter_family, counter_suffix in plan.counters:
                    amount = value_of(record)
                    if amount is None:
                        continue
                    if key is CounterFamily.OVERFLOW:
                        counter_family.add_overflow(amount * weight)
                    else:
                        counter_key = key + counter_suffix if counter_suffix else key
                        counter_family.add(counter_key + (record.outcome,) if by_outcome else counter_key,
                                           amount * weight)
            if record.segments:
                base = (record.model, record.engine_kind, record.service_name)
                cache_key = base + dimensions
                by_name = self._segment_cache.get(cache_key)
                if by_name is None:
                    if len(self._segment_cache) >= self._segment_cache_limit:
                        self._segment_cache.clear()
                        self._segment_too_long.clear()
                    by_name = self._segment_cache[cache_key] = {}
                    label = _too_long(cache_key, self.segment_label_names[:3] + self.segment_label_names[4:],
                                      self.max_label_value_bytes)
                    if label:  # every segment of this key goes to the overflow series
                        by_name[""] = (_series_of(self.segments, self.segments.OVERFLOW), True)
                        self._segment_too_long[cache_key] = label
                everything = by_name.get("")
                if everything is not None:
                    too_long = too_long or self._segment_too_long.get(cache_key, "dimension")
                family = self.segments
                bounds = family.bounds
                for segment in record.segments:
                    name = segment.name
                    duration = (segment.end_unix_ns - segment.start_unix_ns) / 1e9
                    resolved = everything or by_name.get(name)
                    if resolved is None:
                        series = _series_of(family, base + (name,) + dimensions)
                        resolved = by_name[name] = (series, series is family.series.get(family.OVERFLOW))
                    series, overflow = resolved
                    index = bisect_left(bounds, duration)
                    series.counts[index] += weight
                    series.total += duration * weight
                    series.count += weight
                    if series.exponential is not None:
                        series.exponential.observe(duration, weight)
                    if overflow:
                        family.overflowed += 1
                    if with_exemplars:
                        series.exemplars[index] = Exemplar(trace_id, span_id, duration, now)
            if too_long:
                self.too_long[too_long] = self.too_long.get(too_long, 0) + 1
            if self.accounting is not None:
                self.accounting.record(record)

    def _slots(self, plan: _Plan, key: Key) -> list[Any]:
        """A new cache entry: [series per histogram..., whether each is the overflow series..., the
        label whose value is too long or ""]. A too-long value resolves to the overflow series at once."""
        count = len(plan.hists)
        slots: list[Any] = [None] * count + [False] * count + [_too_long(key, plan.label_names,
                                                                          self.max_label_value_bytes)]
        if slots[-1]:
            for position, hist in enumerate(plan.hists):
                family = hist[4]
                slots[position] = _series_of(family, family.OVERFLOW)
                slots[count + position] = True
        return slots

    @staticmethod
    def _resolve(slots: list, position: int, count: int, family: HistogramFamily, key: Key) -> HistogramSeries:
        series = slots[position] = _series_of(family, key)
        slots[count + position] = series is family.series.get(family.OVERFLOW)
        return series

    def keep_exponential(self, max_size: int, max_scale: int) -> None:
        """Every histogram series keeps base-2 exponential buckets too, within the largest limits any
        caller asked for (a caller wanting smaller ones downscales a copy: ``ExponentialState.fitted``).
        Called when the components start, before the first request is recorded."""
        with self.lock:
            histograms = [f for f in self.families() if isinstance(f, HistogramFamily)]
            if any(f.series for f in histograms):
                raise RuntimeError("exponential buckets must be asked for before the first observation")
            for family in histograms:
                old = family.exponential
                family.exponential = (max(max_size, old[0]), max(max_scale, old[1])) if old else (max_size, max_scale)

    def families(self) -> list[HistogramFamily | CounterFamily]:
        out: list[HistogramFamily | CounterFamily] = [self.segments]
        for bound in self.namings:
            out.extend(h.family for h in bound.exposed)
            out.extend(c.family for c in bound.counters)
        if self.accounting is not None:
            out.extend(self.accounting.families.values())
        return out
