"""OTLP metrics push (``exporters.otlp_metrics``, in ``service.pipelines.metrics``): every
``interval`` the recorder's families, both namings, go out as OTLP explicit-bucket histograms and
monotonic sums, with the buckets of ``/metrics``, through opentelemetry-sdk's own OTLP metric
exporters (gRPC or HTTP: their transport, TLS, headers, compression and per-attempt retries).

What is the SDK's and what is ours
    The points are the SDK's ``MetricsData`` / ``HistogramDataPoint`` / ``NumberDataPoint`` /
    ``Exemplar`` objects, built from the families, and ``OTLPMetricExporter.export`` encodes and
    sends them. The SDK's *metrics pipeline* (``MeterProvider``, instruments, views, a
    ``PeriodicExportingMetricReader``) is not used: the families already are the aggregation
    (label-keyed bucket arrays, shared with ``/metrics``, weights for upstream sampling, exemplars
    of kept traces only); recording every observation a second time into SDK instruments would
    double the per-request cost and could not carry the families' exemplars or overflow series.

Names, units, attributes
    Names as declared (``definitions.py``): ``vllm:*``, ``gen_ai.*`` dotted (server and client)
    and the ``otel_llm_*`` request histograms (segments included), with their units (``s``,
    ``{token}``, ``{request}``). Attributes are the label names as declared (dotted for
    ``gen_ai.*``); empty values are left out (Prometheus treats an empty label as absent, and
    semconv's ``error.type`` is only set on errors); ``server.port`` is an int, as semconv says.
    The overflow series carries ``otel.metric.overflow=true``, as the SDKs' cardinality limit does
    (``otel_metric_overflow`` on ``/metrics``). Two scopes: ``otel_llm`` with the schema URL of the
    ``gen_ai`` naming's conventions version (``definitions.GENAI_VERSIONS``) for ``gen_ai.*``, and
    ``otel_llm`` without one for the rest. Resource: ``service.name=otel-llm`` plus
    ``resource_attributes``.

Temporality
    ``cumulative`` (default): every export carries the totals since start (``start_time`` = the
    exporter's creation). ``delta``: per series, the difference from the last *successful* export
    (``start_time`` = that export's time); series without increments are left out, and so are
    exemplars recorded before it. Because the difference is always taken from the last success, a
    failed or dropped export loses nothing in either mode: the next one carries it.

Queue and retry
    A collector thread snapshots the families every ``interval`` into a bounded queue
    (``sending_queue.queue_size`` snapshots); a sender thread exports them oldest first. A full
    queue drops its oldest snapshot (``dropped_snapshots_total{reason="queue_full"}``): only time
    resolution is lost, for the reason above. A failed attempt (one SDK ``export()``, which itself
    retries transient errors within ``timeout``) is retried with ``retry_on_failure``'s backoff
    (±20 % jitter); past ``max_elapsed_time`` (0 = never) the snapshot is dropped
    (``retries_exhausted``) and the next one is sent. The SDK's ``export()`` answers only SUCCESS
    or FAILURE, so a permanent error (HTTP 400) cannot be told from a transient one here: both are
    retried up to ``max_elapsed_time``.

Counting (prefix ``otel_llm_metrics_exporter_``, label ``exporter``)
    ``sent_points_total`` / ``sent_requests_total``, ``failed_points_total`` /
    ``failed_requests_total`` (each failed attempt), ``dropped_snapshots_total{reason}``,
    ``queue_size``.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry

from otel_llm import __version__
from otel_llm.exporter.otlp_metrics.config import OtlpMetricsExporter
from otel_llm.internal.telemetry import TelemetryFamily
from otel_llm.processor.llm_metrics.metrics.definitions import ACCOUNTING_METRICS, SEGMENT_METRIC, SLO_TARGET
from otel_llm.processor.llm_metrics.metrics.exponential import ExponentialState, whole_counts
from otel_llm.processor.llm_metrics.metrics.exposition import OVERFLOW_ATTRIBUTE
from otel_llm.processor.llm_metrics.metrics.families import Family, HistogramFamily
from otel_llm.processor.llm_metrics.metrics.recorder import MetricsRecorder

if TYPE_CHECKING:  # the SDK is imported when an exporter is built
    from opentelemetry.sdk.metrics.export import MetricExporter

log = logging.getLogger(__name__)

METRICS_PATH = "/v1/metrics"
_JITTER = 0.2
_INT_ATTRIBUTES = frozenset({"server.port"})

Key = tuple[str, ...]


@dataclass
class _HistogramSnapshot:
    name: str
    unit: str
    description: str
    bounds: tuple[float, ...]
    label_names: tuple[str, ...]
    schema_url: str  # its naming's conventions ("" = none)
    # key -> (per-bucket counts incl. +Inf, sum, count, {bucket index: (trace_id, span_id, value, ts)}, its bounds)
    series: dict[Key, tuple[tuple[float, ...], float, float, dict[int, tuple[str, str, float, float]], tuple[float, ...]]]
    # key -> its exponential buckets, fitted to the exporter's limits ({} = explicit buckets are pushed)
    exponential: dict[Key, ExponentialState] = field(default_factory=dict)


@dataclass
class _SumSnapshot:
    name: str
    unit: str
    description: str
    label_names: tuple[str, ...]
    schema_url: str
    series: dict[Key, float]


@dataclass
class Snapshot:
    time_ns: int
    histograms: list[_HistogramSnapshot] = field(default_factory=list)
    sums: list[_SumSnapshot] = field(default_factory=list)
    gauges: list[_SumSnapshot] = field(default_factory=list)  # a value now, not a total (the SLO targets)


def take_snapshot(recorder: MetricsRecorder, exponential: tuple[int, int] | None = None) -> Snapshot:
    """A copy of every family's cumulative state, under the recorder's lock (no encoding there);
    ``exponential`` (max_size, max_scale): each series' exponential buckets too, fitted to them."""
    snapshot = Snapshot(time.time_ns())

    def hist(name: str, unit: str, description: str, bounds: tuple[float, ...], label_names: tuple[str, ...],
             family: HistogramFamily, schema_url: str) -> None:
        series = {}
        states = {}
        for key, s in family.series.items():
            series[key] = (tuple(s.counts), s.total, s.count,
                           {i: (e.trace_id, e.span_id, e.value, e.timestamp) for i, e in s.exemplars.items()},
                           s.bounds or bounds)
            if exponential is not None and s.exponential is not None:
                states[key] = s.exponential.fitted(*exponential)
        snapshot.histograms.append(_HistogramSnapshot(name, unit, description, bounds, label_names, schema_url,
                                                      series, states))

    with recorder.lock:
        for bound in recorder.namings:
            schema_url = bound.naming.schema_url
            for exposed in bound.exposed:
                hist(exposed.spec.name, exposed.spec.unit, exposed.spec.description, exposed.family.bounds,
                     exposed.label_names, exposed.family, schema_url)
            for counter in bound.counters:
                names = bound.label_names + counter.extra_label_names
                snapshot.sums.append(_SumSnapshot(counter.spec.name, counter.spec.unit, counter.spec.description,
                                                  names, schema_url, counter.family.totals()))
        hist(SEGMENT_METRIC.name, SEGMENT_METRIC.unit, SEGMENT_METRIC.description, recorder.segments.bounds,
             recorder.segment_label_names, recorder.segments, "")
        accounting = recorder.accounting
        if accounting is not None:  # tenant tokens, cost, SLO outcomes and targets, as on /metrics
            for spec in ACCOUNTING_METRICS:
                if spec.kind == "counter":
                    snapshot.sums.append(_SumSnapshot(spec.name, spec.unit, spec.description, spec.label_names, "",
                                                      accounting.families[spec.name].totals()))
            if accounting.targets:
                snapshot.gauges.append(_SumSnapshot(
                    SLO_TARGET.name, SLO_TARGET.unit, SLO_TARGET.description, SLO_TARGET.label_names, "",
                    {(model,): target for model, target in accounting.targets.items()}))
    return snapshot


def _attributes(label_names: tuple[str, ...], key: Key) -> dict[str, Any]:
    if key == Family.OVERFLOW:
        return {OVERFLOW_ATTRIBUTE: "true"}
    out: dict[str, Any] = {}
    for name, value in zip(label_names, key):
        if value == "":
            continue
        out[name] = int(value) if name in _INT_ATTRIBUTES and value.isdigit() else value
    return out


def build_metrics_data(snapshot: Snapshot, previous: Snapshot | None, start_ns: int, delta: bool,
                       resource_attributes: dict[str, str]) -> tuple[Any, int]:
    """The SDK's ``MetricsData`` for ``snapshot`` (cumulative, or the difference from ``previous``),
    and its number of points."""
    from opentelemetry.sdk.metrics.export import (
        AggregationTemporality,
        Buckets,
        ExponentialHistogram,
        ExponentialHistogramDataPoint,
        Gauge,
        Histogram,
        HistogramDataPoint,
        Metric,
        MetricsData,
        NumberDataPoint,
        ResourceMetrics,
        ScopeMetrics,
        Sum,
    )
    from opentelemetry.sdk.metrics import Exemplar
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    temporality = AggregationTemporality.DELTA if delta else AggregationTemporality.CUMULATIVE
    start = previous.time_ns if (delta and previous is not None) else start_ns
    now = snapshot.time_ns
    before_h = {h.name: h.series for h in previous.histograms} if delta and previous is not None else {}
    old_exponential = {h.name: h.exponential for h in previous.histograms} if delta and previous is not None else {}
    before_s = {s.name: s.series for s in previous.sums} if delta and previous is not None else {}
    since_s = previous.time_ns / 1e9 if delta and previous is not None else 0.0
    metrics: dict[str, list[Any]] = {}  # schema URL -> its scope's metrics
    points = 0
    for h in snapshot.histograms:
        old = before_h.get(h.name, {})
        data_points: list[Any] = []  # explicit or exponential points, one kind per family
        for key, (counts, total, count, exemplars, series_bounds) in h.series.items():
            if key in old:
                old_counts, old_total, old_count, _, _ = old[key]
                counts = tuple(c - o for c, o in zip(counts, old_counts))
                total, count = total - old_total, count - old_count
                if count <= 0:
                    continue
            elif count <= 0:
                continue
            sdk_exemplars = [Exemplar({}, float(value), int(ts * 1e9), span_id=int(span_id, 16),
                                      trace_id=int(trace_id, 16))
                             for _, (trace_id, span_id, value, ts) in sorted(exemplars.items())
                             if trace_id and span_id and ts > since_s]
            state = h.exponential.get(key)
            if state is not None:
                old_state = old_exponential.get(h.name, {}).get(key) if key in old else None
                if old_state is not None:
                    state = exponential_difference(state, old_state)
                (positive_offset, positive), (negative_offset, negative) = state.positive.dense(), state.negative.dense()
                # OTLP: count = zero_count + the buckets, exactly (weights can be fractional).
                zero, negative_whole, positive_whole = whole_counts(state.zero_count, negative, positive)
                data_points.append(ExponentialHistogramDataPoint(
                    attributes=_attributes(h.label_names, key), start_time_unix_nano=start, time_unix_nano=now,
                    count=zero + sum(negative_whole) + sum(positive_whole), sum=float(total), scale=state.scale,
                    zero_count=zero,
                    positive=Buckets(positive_offset, positive_whole),
                    negative=Buckets(negative_offset, negative_whole),
                    flags=0, min=None, max=None, exemplars=sdk_exemplars))  # type: ignore[arg-type]
                continue
            # min/max None: not known from buckets. The SDK annotates them float, but its OTLP encoder
            # passes them to the protobuf message, where None leaves the optional fields unset.
            bucket_counts = whole_counts(0.0, [], list(counts))[2]  # OTLP: count = the buckets' sum, exactly
            data_points.append(HistogramDataPoint(
                attributes=_attributes(h.label_names, key), start_time_unix_nano=start, time_unix_nano=now,
                count=sum(bucket_counts), sum=float(total), bucket_counts=bucket_counts,
                explicit_bounds=list(series_bounds), min=None, max=None, exemplars=sdk_exemplars))  # type: ignore[arg-type]
        if data_points:
            points += len(data_points)
            aggregation = ExponentialHistogram(data_points, temporality) if h.exponential \
                else Histogram(data_points, temporality)
            metrics.setdefault(h.schema_url, []).append(Metric(h.name, h.description, h.unit, aggregation))
    for s in snapshot.sums:
        old_values = before_s.get(s.name, {})
        number_points = []
        for key, value in s.series.items():
            value = value - old_values.get(key, 0.0)
            if delta and value <= 0 and key in old_values:
                continue
            number_points.append(NumberDataPoint(
                attributes=_attributes(s.label_names, key), start_time_unix_nano=start, time_unix_nano=now,
                value=int(value) if float(value).is_integer() else float(value)))
        if number_points:
            points += len(number_points)
            metrics.setdefault(s.schema_url, []).append(Metric(s.name, s.description, s.unit,
                                           Sum(number_points, temporality, is_monotonic=True)))
    for g in snapshot.gauges:  # a gauge's value is the same in either temporality
        gauge_points = [NumberDataPoint(attributes=_attributes(g.label_names, key), start_time_unix_nano=start,
                                        time_unix_nano=now, value=float(value)) for key, value in g.series.items()]
        if gauge_points:
            points += len(gauge_points)
            metrics.setdefault(g.schema_url, []).append(Metric(g.name, g.description, g.unit, Gauge(gauge_points)))
    scopes = [ScopeMetrics(InstrumentationScope("otel_llm", __version__, schema_url or None), scope_metrics,
                           schema_url)
              for schema_url, scope_metrics in sorted(metrics.items(), reverse=True)]
    resource = Resource({"service.name": "otel-llm", "service.version": __version__, **resource_attributes})
    return MetricsData([ResourceMetrics(resource, scopes, "")]), points


def exponential_difference(current: ExponentialState, before: ExponentialState) -> ExponentialState:
    """``current`` minus ``before`` (an earlier state of the same series), at the coarser of their scales."""
    out, old = current.copy(), before.copy()
    scale = min(out.scale, old.scale)
    out.downscale(out.scale - scale)
    old.downscale(old.scale - scale)
    out.zero_count -= old.zero_count
    for mine, theirs in ((out.positive, old.positive), (out.negative, old.negative)):
        for index, count in theirs.counts.items():
            mine.counts[index] = mine.counts.get(index, 0.0) - count
        live = [index for index, count in mine.counts.items() if count > 0]
        mine.counts = {index: mine.counts[index] for index in live}
        if live:
            mine.low, mine.high = min(live), max(live)
        else:
            mine.low, mine.high = 0, -1
    return out


# --- self-telemetry --------------------------------------------------------------------------


_PUSH = "exporters.otlp_metrics"
METRICS_EXPORTER_SENT_POINTS = TelemetryFamily("otel_llm_metrics_exporter_sent_points", "counter",
                                      "Metric points the backend accepted.", ("exporter",), _PUSH)
METRICS_EXPORTER_SENT_REQUESTS = TelemetryFamily("otel_llm_metrics_exporter_sent_requests", "counter",
                                        "Metrics export requests the backend acknowledged.", ("exporter",), _PUSH)
METRICS_EXPORTER_FAILED_POINTS = TelemetryFamily("otel_llm_metrics_exporter_failed_points", "counter",
                                        "Metric points in failed export attempts (each attempt).", ("exporter",), _PUSH)
METRICS_EXPORTER_FAILED_REQUESTS = TelemetryFamily("otel_llm_metrics_exporter_failed_requests", "counter",
                                          "Failed metrics export attempts (each attempt).", ("exporter",), _PUSH)
METRICS_EXPORTER_DROPPED_SNAPSHOTS = TelemetryFamily(
    "otel_llm_metrics_exporter_dropped_snapshots", "counter",
    "Snapshots not exported, by reason; their data goes with the next export.", ("exporter", "reason"), _PUSH,
    "`reason`: `queue_full`, `retries_exhausted`, `shutdown`.")
METRICS_EXPORTER_QUEUE_SIZE = TelemetryFamily("otel_llm_metrics_exporter_queue_size", "gauge",
                                     "Snapshots waiting to be exported.", ("exporter",), _PUSH)


class _Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.sent_points = METRICS_EXPORTER_SENT_POINTS.counter(registry)
        self.sent_requests = METRICS_EXPORTER_SENT_REQUESTS.counter(registry)
        self.failed_points = METRICS_EXPORTER_FAILED_POINTS.counter(registry)
        self.failed_requests = METRICS_EXPORTER_FAILED_REQUESTS.counter(registry)
        self.dropped_snapshots = METRICS_EXPORTER_DROPPED_SNAPSHOTS.counter(registry)
        self.queue_size = METRICS_EXPORTER_QUEUE_SIZE.gauge(registry)


def _sdk_exporter(settings: OtlpMetricsExporter) -> MetricExporter:
    from grpc import Compression as GrpcCompression

    gzip = settings.compression == "gzip"
    timeout = settings.timeout or None
    tls = settings.tls
    if settings.protocol == "http":
        from opentelemetry.exporter.otlp.proto.http import Compression
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpExporter

        endpoint = settings.endpoint or "http://localhost:4318"
        url = endpoint if endpoint.rstrip("/").endswith(METRICS_PATH) else endpoint.rstrip("/") + METRICS_PATH
        return HttpExporter(endpoint=url, certificate_file=tls.ca_file or None,
                            client_key_file=tls.key_file or None, client_certificate_file=tls.cert_file or None,
                            headers=dict(settings.headers), timeout=timeout,
                            compression=Compression.Gzip if gzip else Compression.NoCompression)
    import grpc
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcExporter

    endpoint = settings.endpoint or "localhost:4317"
    insecure = tls.insecure
    if endpoint.startswith("http://"):
        insecure = True
    elif endpoint.startswith("https://"):
        insecure = False
    credentials = None
    if not insecure:
        def read(path: str) -> bytes | None:
            return Path(path).read_bytes() if path else None

        credentials = grpc.ssl_channel_credentials(read(tls.ca_file), read(tls.key_file), read(tls.cert_file))
    return GrpcExporter(endpoint=endpoint, insecure=insecure, credentials=credentials,
                        headers={k.lower(): v for k, v in settings.headers.items()}, timeout=timeout,
                        compression=GrpcCompression.Gzip if gzip else GrpcCompression.NoCompression)


class MetricsPushExporter:
    def __init__(self, name: str, settings: OtlpMetricsExporter, recorder: MetricsRecorder,
                 registry: CollectorRegistry, sdk_exporter: MetricExporter | None = None) -> None:
        self.name = name
        self.settings = settings
        self.recorder = recorder
        self.delta = settings.temporality == "delta"
        self._metrics = _Metrics(registry)
        self._exporter = sdk_exporter if sdk_exporter is not None else _sdk_exporter(settings)
        self._exponential: tuple[int, int] | None = None
        if settings.histogram == "exponential":
            self._exponential = (settings.exponential.max_size, settings.exponential.max_scale)
            recorder.keep_exponential(*self._exponential)
        self._start_ns = time.time_ns()
        self._queue: deque[Snapshot] = deque()
        self._cond = threading.Condition()
        self._stopping = threading.Event()
        self._closed = False
        self._last_success: Snapshot | None = None
        self._threads: list[threading.Thread] = []
        for metric in (self._metrics.sent_points, self._metrics.sent_requests, self._metrics.failed_points,
                       self._metrics.failed_requests):
            metric.labels(name)
        for reason in ("queue_full", "retries_exhausted", "shutdown"):
            self._metrics.dropped_snapshots.labels(name, reason)
        self._metrics.queue_size.labels(name).set(0)

    # --- threads ---

    def start(self) -> None:
        for target, what in ((self._collect_loop, "collect"), (self._send_loop, "send")):
            thread = threading.Thread(target=target, name=f"otel-llm-{self.name}-{what}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def collect_now(self) -> None:
        """Snapshot the families and queue the snapshot (what every ``interval`` does)."""
        snapshot = take_snapshot(self.recorder, self._exponential)
        with self._cond:
            if len(self._queue) >= self.settings.sending_queue.queue_size:
                self._queue.popleft()
                self._metrics.dropped_snapshots.labels(self.name, "queue_full").inc()
            self._queue.append(snapshot)
            self._metrics.queue_size.labels(self.name).set(len(self._queue))
            self._cond.notify_all()

    def _collect_loop(self) -> None:
        while not self._stopping.wait(self.settings.interval):
            try:
                self.collect_now()
            except Exception:  # never let a bug stop the pushes for good
                log.exception("%s: cannot snapshot the metrics", self.name)

    def _send_loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return
                snapshot = self._queue[0]
            self._send_with_retry(snapshot, self._stopping)
            with self._cond:
                if self._queue and self._queue[0] is snapshot:
                    self._queue.popleft()
                self._metrics.queue_size.labels(self.name).set(len(self._queue))

    def _attempt(self, snapshot: Snapshot) -> bool:
        data, points = build_metrics_data(snapshot, self._last_success, self._start_ns, self.delta,
                                          self.settings.resource_attributes)
        if points == 0:
            self._last_success = snapshot
            return True
        try:
            from opentelemetry.sdk.metrics.export import MetricExportResult

            ok = self._exporter.export(data, timeout_millis=(self.settings.timeout or 3600) * 1000) \
                == MetricExportResult.SUCCESS
        except Exception:  # the SDK catches its own; anything else is a failed attempt too
            log.exception("%s: export raised", self.name)
            ok = False
        if ok:
            self._metrics.sent_points.labels(self.name).inc(points)
            self._metrics.sent_requests.labels(self.name).inc()
            self._last_success = snapshot
        else:
            self._metrics.failed_points.labels(self.name).inc(points)
            self._metrics.failed_requests.labels(self.name).inc()
        return ok

    def _send_with_retry(self, snapshot: Snapshot, interrupt: threading.Event | None,
                         deadline: float | None = None) -> bool:
        retry = self.settings.retry_on_failure
        first = time.monotonic()
        wait = retry.initial_interval
        failures = 0
        while True:
            if self._attempt(snapshot):
                if failures:
                    log.info("%s: export succeeded after %d failed attempts", self.name, failures)
                return True
            failures += 1
            if failures == 1:
                log.warning("%s: metrics export to %s failed; retrying", self.name, self.settings.endpoint)
            pause = wait * random.uniform(1 - _JITTER, 1 + _JITTER)
            wait = min(wait * retry.multiplier, retry.max_interval)
            now = time.monotonic()
            exhausted = not retry.enabled or (
                retry.max_elapsed_time > 0 and now + pause - first > retry.max_elapsed_time)
            if deadline is not None and now + pause > deadline:
                self._metrics.dropped_snapshots.labels(self.name, "shutdown").inc()
                return False
            if exhausted:
                self._metrics.dropped_snapshots.labels(self.name, "retries_exhausted").inc()
                return False
            if interrupt is not None and interrupt.wait(pause):
                # Shutting down: the final snapshot (taken by ``shutdown``) supersedes this one.
                self._metrics.dropped_snapshots.labels(self.name, "shutdown").inc()
                return False
            if interrupt is None:
                time.sleep(pause)

    def shutdown(self, grace_s: float) -> None:
        """Stop the interval, export one final snapshot (its totals or increments) within ``grace_s``."""
        self._stopping.set()
        deadline = time.monotonic() + grace_s
        started = bool(self._threads)
        collect_threads, send_threads = self._threads[:1], self._threads[1:]
        for thread in collect_threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        with self._cond:
            dropped = len(self._queue)
            self._queue.clear()
            self._closed = True
            self._cond.notify_all()
        for thread in send_threads:  # finishing its current attempt (the stop cuts its backoff)
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        if dropped:
            self._metrics.dropped_snapshots.labels(self.name, "shutdown").inc(dropped)
        if any(thread.is_alive() for thread in send_threads):
            # An attempt outlived the grace (``timeout`` above it): a final export now would race it.
            log.warning("%s: an export still in flight at shutdown; no final export", self.name)
        elif started:
            try:
                self._send_with_retry(take_snapshot(self.recorder, self._exponential), None, deadline)
            except Exception:
                log.exception("%s: final export failed", self.name)
        self._threads.clear()
        self._metrics.queue_size.labels(self.name).set(0)
        try:
            self._exporter.shutdown(timeout_millis=max(0.0, deadline - time.monotonic()) * 1000)
        except Exception:
            log.debug("%s: SDK exporter shutdown", self.name, exc_info=True)
