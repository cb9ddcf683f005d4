"""Records each request once, in every enabled naming, from the same ``RequestRecord``."""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from dataclasses import dataclass, field

from otel_llm.assembly.records import RequestRecord
from otel_llm.metrics.definitions import SEGMENT_METRIC, CounterSpec, HistogramSpec, Naming, Value
from otel_llm.metrics.families import CounterFamily, Exemplar, HistogramFamily, HistogramSeries, Key


@dataclass(slots=True)
class _BoundHistogram:
    spec: HistogramSpec
    family: HistogramFamily


@dataclass(slots=True)
class _BoundCounter:
    spec: CounterSpec
    family: CounterFamily


@dataclass(slots=True)
class _Observation:
    """One histogram of a naming for one label key: the series resolved once, on first use."""

    value: Value
    success_only: bool
    family: HistogramFamily
    bounds: tuple[float, ...]
    series: HistogramSeries | None = None


@dataclass(slots=True)
class BoundNaming:
    naming: Naming
    label_names: tuple[str, ...]  # naming labels + configured dimensions
    histograms: list[_BoundHistogram]
    counters: list[_BoundCounter]
    # Per label key, what a record observes: one dict lookup per record and naming instead of one per
    # histogram. Only keys within every family's series cap are planned, so this stays bounded.
    plans: dict[Key, list[_Observation]] = field(default_factory=dict)

    def plan(self, key: Key) -> list[_Observation] | None:
        plan = self.plans.get(key)
        if plan is None:
            if any(key not in h.family.series and len(h.family.series) >= h.family.limit for h in self.histograms):
                return None  # over a cap: ``observe`` routes to the overflow series and counts it
            plan = self.plans[key] = [_Observation(h.spec.value, h.spec.success_only, h.family, h.family.bounds)
                                      for h in self.histograms]
        return plan


class MetricsRecorder:
    def __init__(self, namings: list[Naming], dimension_names: tuple[str, ...], series_limit: int) -> None:
        self.dimension_names = dimension_names
        self.namings = [
            BoundNaming(
                naming,
                naming.label_names + dimension_names,
                [_BoundHistogram(h, HistogramFamily(h.name, h.buckets, series_limit)) for h in naming.histograms],
                [_BoundCounter(c, CounterFamily(c.name, series_limit)) for c in naming.counters],
            )
            for naming in namings
        ]
        self.segments = HistogramFamily(SEGMENT_METRIC.name, SEGMENT_METRIC.buckets, series_limit)
        self.segment_label_names = ("model_name", "engine_kind", "service_name", "segment") + dimension_names
        self._segment_series: dict[Key, HistogramSeries] = {}  # bounded by the family's cap
        self.lock = threading.Lock()
        self.requests_recorded = 0

    def record(self, record: RequestRecord, with_exemplars: bool = False) -> None:
        """Observe ``record`` in every naming; ``with_exemplars`` only for traces the sampler kept."""
        weight = record.weight
        succeeded = record.succeeded
        trace_id = record.trace_id.hex() if with_exemplars else ""
        span_id = record.span_id.hex() if with_exemplars else ""
        now = time.time()
        with self.lock:
            self.requests_recorded += 1
            for bound in self.namings:
                key: Key = bound.naming.labels(record) + record.dimensions
                plan = bound.plan(key)
                if plan is None:
                    self._observe_each(bound, key, record, weight, trace_id, span_id, now, with_exemplars)
                else:
                    for observation in plan:
                        if observation.success_only and not succeeded:
                            continue
                        value = observation.value(record)
                        if value is None:
                            continue
                        series = observation.series
                        if series is None:
                            series = observation.series = observation.family.admitted_series(key)
                            assert series is not None  # planned keys are within the cap
                        # HistogramFamily.observe, inlined: this runs ~17 times per request.
                        index = bisect_left(observation.bounds, value)
                        series.counts[index] += weight
                        series.total += value * weight
                        series.count += weight
                        if with_exemplars:
                            series.exemplars[index] = Exemplar(trace_id, span_id, value, now)
                for counter in bound.counters:
                    amount = counter.spec.value(record)
                    if amount is None:
                        continue
                    counter.family.add(key + (record.outcome,) if counter.spec.by_outcome else key, amount * weight)
            if record.segments:
                base = (record.model, record.engine_kind, record.service_name)
                family = self.segments
                bounds = family.bounds
                for segment in record.segments:
                    duration = segment.duration_s
                    key = base + (segment.name,) + record.dimensions
                    series = self._segment_series.get(key)
                    if series is None:
                        series = family.admitted_series(key)
                        if series is None:  # over the cap: the overflow series, counted
                            exemplar = Exemplar(trace_id, span_id, duration, now) if with_exemplars else None
                            family.observe(key, duration, weight, exemplar)
                            continue
                        self._segment_series[key] = series
                    index = bisect_left(bounds, duration)
                    series.counts[index] += weight
                    series.total += duration * weight
                    series.count += weight
                    if with_exemplars:
                        series.exemplars[index] = Exemplar(trace_id, span_id, duration, now)

    @staticmethod
    def _observe_each(bound: BoundNaming, key: Key, record: RequestRecord, weight: float, trace_id: str,
                      span_id: str, now: float, with_exemplars: bool) -> None:
        """The unplanned path, for keys over a series cap."""
        for hist in bound.histograms:
            if hist.spec.success_only and not record.succeeded:
                continue
            value = hist.spec.value(record)
            if value is not None:
                exemplar = Exemplar(trace_id, span_id, value, now) if with_exemplars else None
                hist.family.observe(key, value, weight, exemplar)

    def families(self) -> list[HistogramFamily | CounterFamily]:
        out: list[HistogramFamily | CounterFamily] = [self.segments]
        for bound in self.namings:
            out.extend(h.family for h in bound.histograms)
            out.extend(c.family for c in bound.counters)
        return out
