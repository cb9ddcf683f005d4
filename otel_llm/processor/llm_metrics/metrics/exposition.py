"""A prometheus_client collector over the recorder's families: text 0.0.4 and OpenMetrics both
come from prometheus_client's own encoders, with exemplars only where OpenMetrics is asked for."""

from __future__ import annotations

import math
from collections.abc import Iterator

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Exemplar as PromExemplar

from otel_llm.internal.telemetry import TelemetryFamily
from otel_llm.processor.llm_metrics.metrics.definitions import SEGMENT_METRIC, prometheus_label_name, prometheus_metric_name
from otel_llm.processor.llm_metrics.metrics.exponential import ExponentialState
from otel_llm.processor.llm_metrics.metrics.families import CounterFamily, Family, HistogramFamily
from otel_llm.processor.llm_metrics.metrics.recorder import MetricsRecorder

# The overflow series of a capped metric, labelled as the OTel SDKs' cardinality limit and the
# Collector's spanmetrics label theirs: attribute ``otel.metric.overflow=true`` (spec
# metrics/sdk.md "Cardinality limits"; contrib PR #39664; research/field-2026.md, lessons §6),
# which the OTLP->Prometheus rules expose as ``otel_metric_overflow`` (before: ``otel_llm_overflow``).
OVERFLOW_ATTRIBUTE = "otel.metric.overflow"
OVERFLOW_LABELS = {prometheus_label_name(OVERFLOW_ATTRIBUTE): "true"}

# The recorder's own accounting of its series, exposed beside them.
SERIES_OVERFLOW = TelemetryFamily(
    "otel_llm_series_overflow", "counter",
    "Observations sent to a metric's overflow series because its series cap was reached.", ("metric",),
    "processors.llm_metrics", "A series for each span-derived family, 0 until its cap is reached; "
                              "[Troubleshooting](../troubleshooting.md#series-overflow).")
LABEL_VALUES_TOO_LONG = TelemetryFamily(
    "otel_llm_label_values_too_long", "counter", "Requests whose label value exceeded max_label_value_bytes, by "
    "label; their observations went to the overflow series.", ("label",), "processors.llm_metrics")
SERIES_BYTES = TelemetryFamily(
    "otel_llm_series_bytes", "gauge",
    "Estimated exposition bytes of the span-derived metrics' series, against series_limit_mib.", ("state",),
    "processors.llm_metrics", "`state`: `used`, `limit` (`series_limit_mib` in bytes).")


def _le(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(float(bound))


def _unit_word(unit: str) -> str:
    return "seconds" if unit == "s" else ""


class NativeHistogramMetric(Metric):
    """A histogram family whose series may carry native (exponential) parts: labels as exposed ->
    the series' exponential state, a copy fitted to Prometheus's limits under the recorder's lock.
    The text encoders ignore them; ``exporters.prometheus``'s protobuf exposition sends them."""

    def __init__(self, name: str, documentation: str, unit: str = "") -> None:
        super().__init__(name, documentation, "histogram", unit)
        self.native: dict[frozenset[tuple[str, str]], ExponentialState] = {}


# Prometheus native histogram schemas go up to 8 (prometheus/docs native_histograms.md).
NATIVE_MAX_SCHEMA = 8


class RecorderCollector(Collector):
    def __init__(self, recorder: MetricsRecorder) -> None:
        self._recorder = recorder

    def collect(self) -> Iterator[Metric]:
        recorder = self._recorder
        with recorder.lock:
            snapshot = []
            units: dict[str, str] = {}  # a family's unit, for its exposed name in the overflow count
            for bound in recorder.namings:
                label_names = tuple(prometheus_label_name(n) for n in bound.label_names)
                for hist in bound.exposed:
                    units[hist.family.name] = hist.spec.unit
                    snapshot.append(_histogram(hist.spec.name, hist.spec.unit, hist.spec.description,
                                               hist.family.bounds,
                                               tuple(prometheus_label_name(n) for n in hist.label_names),
                                               hist.family, recorder.native_max_size))
                for counter in bound.counters:
                    names = label_names + tuple(prometheus_label_name(n) for n in counter.extra_label_names)
                    snapshot.append(_counter(exposed_name(counter.spec.name, counter.spec.unit),
                                             counter.spec.description, names, counter.family))
                    units[counter.family.name] = counter.spec.unit
            if recorder.accounting is not None:
                snapshot.extend(recorder.accounting.collect(OVERFLOW_LABELS))
            snapshot.append(_histogram(SEGMENT_METRIC.name, SEGMENT_METRIC.unit, SEGMENT_METRIC.description,
                                       recorder.segments.bounds,
                                       tuple(prometheus_label_name(n) for n in recorder.segment_label_names),
                                       recorder.segments, recorder.native_max_size))
            overflow = SERIES_OVERFLOW.collected()
            for family in recorder.families():
                overflow.add_metric([exposed_name(family.name, units.get(family.name, "s"))], family.overflowed)
            snapshot.append(overflow)
            too_long = LABEL_VALUES_TOO_LONG.collected()
            for label, requests in sorted(recorder.too_long.items()):
                too_long.add_metric([label], requests)
            snapshot.append(too_long)
            budget = SERIES_BYTES.collected()
            budget.add_metric(["used"], recorder.budget.used)
            budget.add_metric(["limit"], recorder.budget.limit)
            snapshot.append(budget)
        yield from snapshot


def _labels(label_names: tuple[str, ...], key: tuple[str, ...]) -> dict[str, str]:
    if key == Family.OVERFLOW:
        return dict(OVERFLOW_LABELS)
    return dict(zip(label_names, key))


def exposed_name(name: str, unit: str = "s") -> str:
    """The Prometheus name of a declared metric: OTel dotted names are translated, vLLM names kept."""
    return prometheus_metric_name(name, unit) if "." in name else name


def _histogram(name: str, unit: str, doc: str, bounds: tuple[float, ...], label_names: tuple[str, ...],
               family: HistogramFamily, native_max_size: int | None = None) -> Metric:
    metric_name = exposed_name(name, unit)
    word = _unit_word(unit)
    base = metric_name[: -len(word) - 1] if word and metric_name.endswith("_" + word) else metric_name
    metric = NativeHistogramMetric(base, doc, word) if native_max_size else Metric(base, doc, "histogram", word)
    family_les = [_le(b) for b in bounds] + ["+Inf"]
    for key, series in family.series.items():
        labels = _labels(label_names, key)
        if native_max_size and series.exponential is not None and isinstance(metric, NativeHistogramMetric):
            metric.native[frozenset(labels.items())] = series.exponential.fitted(native_max_size, NATIVE_MAX_SCHEMA)
        les = [_le(b) for b in series.bounds] + ["+Inf"] if series.bounds else family_les
        cumulative = 0.0
        counts, exemplars = series.counts, series.exemplars  # the core's series hands out a copy per read
        for index, le in enumerate(les):
            cumulative += counts[index]
            exemplar = exemplars.get(index)
            prom_exemplar = (
                PromExemplar({"trace_id": exemplar.trace_id, "span_id": exemplar.span_id}, exemplar.value,
                             exemplar.timestamp)
                if exemplar is not None else None
            )
            metric.add_sample(metric.name + "_bucket", {**labels, "le": le}, cumulative, None, prom_exemplar)
        metric.add_sample(metric.name + "_count", labels, series.count)
        metric.add_sample(metric.name + "_sum", labels, series.total)
    return metric


def _counter(name: str, doc: str, label_names: tuple[str, ...], family: CounterFamily) -> Metric:
    metric = Metric(name, doc, "counter")
    for key, value in family.totals().items():
        metric.add_sample(name + "_total", _labels(label_names, key), value)
    return metric
