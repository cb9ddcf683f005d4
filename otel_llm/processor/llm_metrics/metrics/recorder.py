"""Records each request once, in every enabled naming, from the same ``RequestRecord``."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from otel_llm.pdata.records import RequestRecord
from otel_llm.processor.llm_metrics.metrics.definitions import SEGMENT_METRIC, CounterSpec, HistogramSpec, Naming
from otel_llm.processor.llm_metrics.metrics.families import CounterFamily, Exemplar, HistogramFamily, Key


@dataclass(slots=True)
class _BoundHistogram:
    spec: HistogramSpec
    family: HistogramFamily
    key_suffix: Key  # the spec's fixed label value, if it has one


@dataclass(slots=True)
class _BoundCounter:
    spec: CounterSpec
    family: CounterFamily


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


def _bind(naming: Naming, dimension_names: tuple[str, ...], series_limit: int) -> BoundNaming:
    label_names = naming.label_names + dimension_names
    exposed: dict[str, ExposedHistogram] = {}
    histograms = []
    for spec in naming.histograms:
        shared = exposed.get(spec.name)
        if shared is None:
            extra = (spec.fixed_label[0],) if spec.fixed_label else ()
            shared = exposed[spec.name] = ExposedHistogram(
                spec, HistogramFamily(spec.name, spec.buckets, series_limit), label_names + extra)
        histograms.append(_BoundHistogram(spec, shared.family, (spec.fixed_label[1],) if spec.fixed_label else ()))
    counters = [_BoundCounter(c, CounterFamily(c.name, series_limit)) for c in naming.counters]
    return BoundNaming(naming, label_names, histograms, counters, list(exposed.values()))


class MetricsRecorder:
    def __init__(self, namings: list[Naming], dimension_names: tuple[str, ...], series_limit: int) -> None:
        self.dimension_names = dimension_names
        self.namings = [_bind(naming, dimension_names, series_limit) for naming in namings]
        self._by_side: dict[str, list[BoundNaming]] = {}
        for bound in self.namings:
            self._by_side.setdefault(bound.naming.side, []).append(bound)
        self.segments = HistogramFamily(SEGMENT_METRIC.name, SEGMENT_METRIC.buckets, series_limit)
        self.segment_label_names = ("model_name", "engine_kind", "service_name", "segment") + dimension_names
        self.lock = threading.Lock()
        self.requests_recorded = 0

    def record(self, record: RequestRecord, with_exemplars: bool = False) -> None:
        """Observe ``record`` in every naming of its side; ``with_exemplars`` only for traces the sampler kept."""
        weight = record.weight
        succeeded = record.succeeded
        trace_id = record.trace_id.hex() if with_exemplars else ""
        span_id = record.span_id.hex() if with_exemplars else ""
        now = time.time()
        with self.lock:
            self.requests_recorded += 1
            for bound in self._by_side.get(record.side, ()):
                key: Key = bound.naming.labels(record) + record.dimensions
                for hist in bound.histograms:
                    if hist.spec.success_only and not succeeded:
                        continue
                    if hist.spec.per_step is not None:
                        for step in hist.spec.per_step(record):
                            hist.family.observe(key + hist.key_suffix if hist.key_suffix else key, step, weight,
                                                Exemplar(trace_id, span_id, step, now) if with_exemplars else None)
                        continue
                    value = hist.spec.value(record)
                    if value is not None:
                        exemplar = Exemplar(trace_id, span_id, value, now) if with_exemplars else None
                        hist.family.observe(key + hist.key_suffix if hist.key_suffix else key, value, weight,
                                            exemplar)
                for counter in bound.counters:
                    amount = counter.spec.value(record)
                    if amount is None:
                        continue
                    counter.family.add(key + (record.outcome,) if counter.spec.by_outcome else key, amount * weight)
            if record.segments:
                base = (record.model, record.engine_kind, record.service_name)
                for segment in record.segments:
                    duration = segment.duration_s
                    exemplar = Exemplar(trace_id, span_id, duration, now) if with_exemplars else None
                    self.segments.observe(base + (segment.name,) + record.dimensions, duration, weight, exemplar)

    def families(self) -> list[HistogramFamily | CounterFamily]:
        out: list[HistogramFamily | CounterFamily] = [self.segments]
        for bound in self.namings:
            out.extend(h.family for h in bound.exposed)
            out.extend(c.family for c in bound.counters)
        return out
