"""The Prometheus protobuf exposition (``io.prometheus.client.MetricFamily``, length-delimited), the
one format in which Prometheus scrapes native histograms.

prometheus_client 0.26 encodes text 0.0.4 and OpenMetrics only (its native histograms are an
OpenMetrics 2.0 text draft Prometheus does not parse), so the messages are built here. The schema is
the proto2 ``io/prometheus/client/metrics.proto`` of prometheus/client_model as the native-histogram
spec quotes it (prometheus/docs ``native_histograms.md``, "Classic Prometheus formats"): field
numbers below are that file's. It is declared as a ``FileDescriptorProto`` and built into the
default descriptor pool at import (as ``otel_llm.pdata.otlp_view`` does), so the ``protobuf``
runtime already installed encodes it; no generated code, no protoc.

A histogram is sent with its classic buckets and, where the recorder keeps an exponential state for
the series, its native parts: ``schema`` (the state's scale, at most 8: Prometheus accepts -4 .. 8),
``zero_threshold`` 0 (values equal to 0 are the zero bucket), spans and delta-encoded counts.
Prometheus bucket ``i`` is ``(2**((i-1)/2**s), 2**(i/2**s)]``; OTel's index ``i`` is
``(base**i, base**(i+1)]``, so the Prometheus index is OTel's plus one (as the Collector's
prometheusremotewrite translation does). Exemplars and ``_created`` are not sent in this format.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from prometheus_client.metrics_core import Metric

from otel_llm.processor.llm_metrics.metrics.exponential import whole_counts
from otel_llm.internal.wire import encode_varint
from otel_llm.processor.llm_metrics.metrics.exposition import NativeHistogramMetric

CONTENT_TYPE = "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited"
FILE_NAME = "otel_llm/prometheus/io_prometheus_client_metrics.proto"
PACKAGE = "io.prometheus.client"
MIN_SCHEMA, MAX_SCHEMA = -4, 8  # native histogram schemas Prometheus accepts

_F = descriptor_pb2.FieldDescriptorProto
_OPTIONAL, _REPEATED = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED
# message -> (name, number, label, type, message type); the numbers of client_model's metrics.proto.
_MESSAGES: dict[str, list[tuple[str, int, int, int, str]]] = {
    "LabelPair": [("name", 1, _OPTIONAL, _F.TYPE_STRING, ""), ("value", 2, _OPTIONAL, _F.TYPE_STRING, "")],
    "Gauge": [("value", 1, _OPTIONAL, _F.TYPE_DOUBLE, "")],
    "Counter": [("value", 1, _OPTIONAL, _F.TYPE_DOUBLE, "")],
    "Quantile": [("quantile", 1, _OPTIONAL, _F.TYPE_DOUBLE, ""), ("value", 2, _OPTIONAL, _F.TYPE_DOUBLE, "")],
    "Summary": [("sample_count", 1, _OPTIONAL, _F.TYPE_UINT64, ""), ("sample_sum", 2, _OPTIONAL, _F.TYPE_DOUBLE, ""),
                ("quantile", 3, _REPEATED, _F.TYPE_MESSAGE, "Quantile")],
    "Untyped": [("value", 1, _OPTIONAL, _F.TYPE_DOUBLE, "")],
    "Histogram": [
        ("sample_count", 1, _OPTIONAL, _F.TYPE_UINT64, ""), ("sample_count_float", 4, _OPTIONAL, _F.TYPE_DOUBLE, ""),
        ("sample_sum", 2, _OPTIONAL, _F.TYPE_DOUBLE, ""), ("bucket", 3, _REPEATED, _F.TYPE_MESSAGE, "Bucket"),
        ("schema", 5, _OPTIONAL, _F.TYPE_SINT32, ""), ("zero_threshold", 6, _OPTIONAL, _F.TYPE_DOUBLE, ""),
        ("zero_count", 7, _OPTIONAL, _F.TYPE_UINT64, ""), ("zero_count_float", 8, _OPTIONAL, _F.TYPE_DOUBLE, ""),
        ("negative_span", 9, _REPEATED, _F.TYPE_MESSAGE, "BucketSpan"),
        ("negative_delta", 10, _REPEATED, _F.TYPE_SINT64, ""), ("negative_count", 11, _REPEATED, _F.TYPE_DOUBLE, ""),
        ("positive_span", 12, _REPEATED, _F.TYPE_MESSAGE, "BucketSpan"),
        ("positive_delta", 13, _REPEATED, _F.TYPE_SINT64, ""), ("positive_count", 14, _REPEATED, _F.TYPE_DOUBLE, ""),
    ],
    "Bucket": [("cumulative_count", 1, _OPTIONAL, _F.TYPE_UINT64, ""),
               ("cumulative_count_float", 4, _OPTIONAL, _F.TYPE_DOUBLE, ""),
               ("upper_bound", 2, _OPTIONAL, _F.TYPE_DOUBLE, "")],
    "BucketSpan": [("offset", 1, _OPTIONAL, _F.TYPE_SINT32, ""), ("length", 2, _OPTIONAL, _F.TYPE_UINT32, "")],
    "Metric": [("label", 1, _REPEATED, _F.TYPE_MESSAGE, "LabelPair"), ("gauge", 2, _OPTIONAL, _F.TYPE_MESSAGE, "Gauge"),
               ("counter", 3, _OPTIONAL, _F.TYPE_MESSAGE, "Counter"),
               ("summary", 4, _OPTIONAL, _F.TYPE_MESSAGE, "Summary"),
               ("untyped", 5, _OPTIONAL, _F.TYPE_MESSAGE, "Untyped"),
               ("histogram", 7, _OPTIONAL, _F.TYPE_MESSAGE, "Histogram"),
               ("timestamp_ms", 6, _OPTIONAL, _F.TYPE_INT64, "")],
    "MetricFamily": [("name", 1, _OPTIONAL, _F.TYPE_STRING, ""), ("help", 2, _OPTIONAL, _F.TYPE_STRING, ""),
                     ("type", 3, _OPTIONAL, _F.TYPE_ENUM, "MetricType"),
                     ("metric", 4, _REPEATED, _F.TYPE_MESSAGE, "Metric")],
}
METRIC_TYPES = {"COUNTER": 0, "GAUGE": 1, "SUMMARY": 2, "UNTYPED": 3, "HISTOGRAM": 4, "GAUGE_HISTOGRAM": 5}


def _schema() -> descriptor_pb2.FileDescriptorProto:
    schema = descriptor_pb2.FileDescriptorProto(name=FILE_NAME, package=PACKAGE, syntax="proto2")
    enum = schema.enum_type.add(name="MetricType")
    for name, number in METRIC_TYPES.items():
        enum.value.add(name=name, number=number)
    for message_name, fields in _MESSAGES.items():
        message = schema.message_type.add(name=message_name)
        for name, number, label, kind, type_name in fields:
            field = message.field.add(name=name, number=number, label=label, type=kind)
            if type_name:
                field.type_name = f".{PACKAGE}.{type_name}"
    return schema


def _build() -> Any:
    pool = descriptor_pool.Default()
    try:
        return pool.FindFileByName(FILE_NAME)
    except KeyError:
        pool.Add(_schema())
        return pool.FindFileByName(FILE_NAME)


DESCRIPTOR = _build()
MetricFamily: Any = message_factory.GetMessageClass(DESCRIPTOR.message_types_by_name["MetricFamily"])


def _labels(metric: Any, labels: dict[str, str]) -> None:
    for name, value in labels.items():
        pair = metric.label.add()
        pair.name, pair.value = name, value


def _spans(offset: int, counts: list[int], target: Any, spans_field: str, deltas_field: str) -> None:
    """Sparse buckets: runs of non-empty buckets as spans (offset = gap from the previous run's end),
    counts as deltas from the previous bucket."""
    spans, deltas = getattr(target, spans_field), getattr(target, deltas_field)
    previous_end = None
    previous_count = 0
    index = offset + 1  # OTel index -> Prometheus index
    for whole in counts:
        if whole > 0:
            if previous_end is None or index != previous_end:
                span = spans.add()
                span.offset = index if previous_end is None else index - previous_end
                span.length = 0
            spans[-1].length += 1
            deltas.append(whole - previous_count)
            previous_count = whole
            previous_end = index + 1
        index += 1


def _histogram(family: Any, metric: Metric) -> None:
    native = metric.native if isinstance(metric, NativeHistogramMetric) else {}
    series: dict[frozenset[tuple[str, str]], dict[str, Any]] = {}
    for sample in metric.samples:
        labels = {k: v for k, v in sample.labels.items() if k != "le"}
        key = frozenset(labels.items())
        entry = series.setdefault(key, {"labels": labels, "buckets": [], "count": 0.0, "sum": 0.0})
        if sample.name.endswith("_bucket"):
            entry["buckets"].append((float(sample.labels["le"]), sample.value))
        elif sample.name.endswith("_count"):
            entry["count"] = sample.value
        elif sample.name.endswith("_sum"):
            entry["sum"] = sample.value
    for key, entry in series.items():
        out = family.metric.add()
        _labels(out, entry["labels"])
        histogram = out.histogram
        histogram.sample_count = int(round(entry["count"]))
        histogram.sample_sum = entry["sum"]
        for upper, cumulative in entry["buckets"]:
            if math.isinf(upper):
                continue  # the +Inf bucket is optional: sample_count is it
            bucket = histogram.bucket.add()
            bucket.upper_bound, bucket.cumulative_count = upper, int(round(cumulative))
        state = native.get(key)
        if state is not None and MIN_SCHEMA <= state.scale <= MAX_SCHEMA:
            histogram.schema = state.scale
            histogram.zero_threshold = 0.0
            (negative_offset, negative), (positive_offset, positive) = state.negative.dense(), state.positive.dense()
            zero, negative_whole, positive_whole = whole_counts(state.zero_count, negative, positive)
            histogram.zero_count = zero
            _spans(positive_offset, positive_whole, histogram, "positive_span", "positive_delta")
            _spans(negative_offset, negative_whole, histogram, "negative_span", "negative_delta")
            # Prometheus refuses a native histogram whose buckets hold more than its count.
            histogram.sample_count = max(histogram.sample_count, zero + sum(negative_whole) + sum(positive_whole))
            if not histogram.positive_span:
                # The spec's "no-op span": without it an empty native histogram reads as a classic one.
                histogram.positive_span.add(offset=0, length=0)


def encode(metrics: Iterable[Metric]) -> bytes:
    """Length-delimited ``MetricFamily`` messages for every family ``metrics`` yields."""
    out = bytearray()
    for metric in metrics:
        families: list[Any] = []
        if metric.type == "histogram":
            family = MetricFamily(name=metric.name, help=metric.documentation, type=METRIC_TYPES["HISTOGRAM"])
            _histogram(family, metric)
            families.append(family)
        elif metric.type == "counter":
            family = MetricFamily(name=metric.name + "_total", help=metric.documentation,
                                  type=METRIC_TYPES["COUNTER"])
            for sample in metric.samples:
                if sample.name.endswith("_total"):
                    point = family.metric.add()
                    _labels(point, sample.labels)
                    point.counter.value = sample.value
            families.append(family)
        elif metric.type == "summary":
            family = MetricFamily(name=metric.name, help=metric.documentation, type=METRIC_TYPES["SUMMARY"])
            by_labels: dict[frozenset[tuple[str, str]], Any] = {}
            for sample in metric.samples:
                labels = {k: v for k, v in sample.labels.items() if k != "quantile"}
                point = by_labels.get(frozenset(labels.items()))
                if point is None:
                    point = by_labels[frozenset(labels.items())] = family.metric.add()
                    _labels(point, labels)
                if sample.name.endswith("_count"):
                    point.summary.sample_count = int(round(sample.value))
                elif sample.name.endswith("_sum"):
                    point.summary.sample_sum = sample.value
                elif "quantile" in sample.labels:
                    point.summary.quantile.add(quantile=float(sample.labels["quantile"]), value=sample.value)
            families.append(family)
        else:
            # gauge, info, stateset, unknown: each sample name a gauge family of its own
            # (``_created`` and info's ``_info`` samples are plain values there).
            by_name: dict[str, Any] = {}
            for sample in metric.samples:
                if sample.name.endswith("_created"):
                    continue
                family = by_name.get(sample.name)
                if family is None:
                    kind = "UNTYPED" if metric.type == "unknown" else "GAUGE"
                    family = by_name[sample.name] = MetricFamily(name=sample.name, help=metric.documentation,
                                                                 type=METRIC_TYPES[kind])
                point = family.metric.add()
                _labels(point, sample.labels)
                if metric.type == "unknown":
                    point.untyped.value = sample.value
                else:
                    point.gauge.value = sample.value
            families.extend(by_name.values())
        for family in families:
            if family.metric:
                body = family.SerializeToString()
                out += encode_varint(len(body)) + body
    return bytes(out)


def asks_for_protobuf(accept: str) -> bool:
    """Whether ``accept`` prefers the delimited MetricFamily protobuf (highest q among what it lists),
    as Prometheus with native histograms on does."""
    best_other = -1.0
    protobuf_q = -1.0
    for entry in accept.split(","):
        parts = [p.strip() for p in entry.split(";")]
        media = parts[0].lower()
        params = {}
        for part in parts[1:]:
            if "=" in part:
                name, value = part.split("=", 1)
                params[name.strip().lower()] = value.strip()
        try:
            q = float(params.get("q", "1"))
        except ValueError:
            q = 0.0
        if (media == "application/vnd.google.protobuf" and params.get("proto") == "io.prometheus.client.MetricFamily"
                and params.get("encoding") == "delimited"):
            protobuf_q = max(protobuf_q, q)
        elif media:
            best_other = max(best_other, q)
    return protobuf_q > 0 and protobuf_q >= best_other
