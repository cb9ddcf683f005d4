"""Sampling policies over a completed trace and its request records; each a small pure object."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from opentelemetry.proto.trace.v1.trace_pb2 import Status

from otel_llm.internal import core as native_core
from otel_llm.pdata.records import Outcome, RequestRecord, Side
from otel_llm.pdata.spans import PendingTrace
from otel_llm.processor.tail_sampling.quantiles import RollingQuantile

# The record attribute each policy metric reads (the compiled core's slowest policy reads them by name).
METRIC_ATTRIBUTES: dict[str, str] = {
    "ttft": "ttft_s",
    "tpot": "tpot_s",
    "e2e": "e2e_s",
    "queue": "queue_s",
    "gateway_overhead": "gateway_overhead_s",
}
# attrgetter: a field read in C, about half a lambda's call (the slowest policy reads two per request).
METRICS: dict[str, Callable[[RequestRecord], float | None]] = {
    metric: attrgetter(attribute) for metric, attribute in METRIC_ATTRIBUTES.items()}
# Looked up once, not per trace.
_FAILED = Outcome.FAILED
_SERVER = Side.SERVER
_STATUS_ERROR = Status.STATUS_CODE_ERROR
_OTHER_MODEL = "__other__"  # the window every model past ``max_models`` shares


class Policy:
    name: str

    def matches(self, trace: PendingTrace, records: list[RequestRecord]) -> bool:
        raise NotImplementedError


@dataclass
class ErrorsPolicy(Policy):
    """Any span with status ERROR, and every request whose outcome is an error or an abort."""

    name: str = "errors"

    def matches(self, trace: PendingTrace, records: list[RequestRecord]) -> bool:
        # Plain loops: a generator per check costs more than the check on these few items.
        for record in records:
            if record.outcome in _FAILED:  # an error or an abort
                return True
        for span in trace.spans.values():
            if span.status_code == _STATUS_ERROR:
                return True
        return False



@dataclass
class SloPolicy(Policy):
    """Any request above a static threshold; ``per_model`` overrides the defaults for a model."""

    thresholds: dict[str, float]
    per_model: dict[str, dict[str, float]] = field(default_factory=dict)
    name: str = "slo"

    def matches(self, trace: PendingTrace, records: list[RequestRecord]) -> bool:
        for record in records:
            if record.side != Side.SERVER:
                continue  # thresholds are on the server's latencies; a client's duration is another quantity
            limits = {**self.thresholds, **self.per_model.get(record.model, {})}
            for metric, limit in limits.items():
                value = METRICS[metric](record)
                if value is not None and value > limit:
                    return True
        return False


class SlowestPolicy(Policy):
    """Above the rolling per-model quantile of each chosen metric: no static threshold to tune.

    The threshold is the quantile of the requests seen *before* this one, so the first request of a
    model and any new extreme during warm-up are kept, and steady traffic keeps ~(1 - quantile).
    """

    def __init__(self, metrics: list[str], quantile: float, window_s: float, max_models: int = 1000,
                 name: str = "slowest", clock: Callable[[], float] = time.monotonic, core: Any = True) -> None:
        """``core``: the compiled core whose ``SlowestWindows`` runs this policy's loop and keeps its windows
        (``True``: the process's choice, ``internal/core.py``; ``None`` or ``False``: the loop below and
        ``quantiles.py``'s windows, the reference)."""
        self.name = name
        self.metrics = metrics
        self.quantile = quantile
        self.window_s = window_s
        self.max_models = max_models
        self._clock = clock
        self._windows: dict[tuple[str, str], RollingQuantile] = {}
        self._lock = threading.Lock()
        self._readers = tuple(METRICS[metric] for metric in metrics)
        # Per model, each metric's window once resolved (None before): a model's window never
        # changes once chosen (windows are never dropped), so this only saves the keyed lookups.
        # Bounded whatever the model names (a flood clears it).
        self._by_model: dict[str, list[RollingQuantile | None]] = {}
        self._by_model_limit = 2 * max_models + 64
        # The core numbers slices in 64-bit integers: at the shortest window the config allows (1 ms,
        # ten 0.1 ms slices) a monotonic clock reaches 2^63 slices after ~29 million years.
        extension = native_core.active()[0] if core is True else (core or None)
        # With the core, the loop below and its windows run there (``rust/src/quantiles.rs``
        # ``SlowestWindows``): one call per trace instead of a dozen Python steps per request.
        self._native: Any = (extension.SlowestWindows(
            [METRIC_ATTRIBUTES[metric] for metric in metrics], list(metrics), quantile, window_s, max_models,
            self._by_model_limit, clock, _FAILED, _SERVER, _OTHER_MODEL) if extension is not None else None)

    def _window(self, model: str, metric: str) -> RollingQuantile | None:
        key = (model, metric)
        window = self._windows.get(key)
        if window is None:
            if len(self._windows) >= self.max_models * len(self.metrics):
                key = (_OTHER_MODEL, metric)  # bounded memory under a flood of model names
                window = self._windows.get(key)
            if window is None:
                window = self._windows[key] = RollingQuantile(self.window_s, clock=self._clock)
        return window

    def matches(self, trace: PendingTrace, records: list[RequestRecord]) -> bool:
        if self._native is not None:
            with self._lock:
                return bool(self._native.matches(records))
        slow = False
        quantile = self.quantile
        with self._lock:
            # Read once per trace (its requests are judged at one instant), and its time slice
            # found once: every window has the same length and slices.
            now: float | None = None
            slice_id = slice_position = 0
            for record in records:
                if record.outcome in _FAILED or record.side != _SERVER:  # not record.succeeded
                    continue
                model = record.model
                windows = self._by_model.get(model)
                if windows is None:
                    if len(self._by_model) >= self._by_model_limit:
                        self._by_model.clear()
                    windows = self._by_model[model] = [None] * len(self._readers)
                position = -1
                for read in self._readers:
                    position += 1
                    value = read(record)
                    if value is None:
                        continue
                    window = windows[position]
                    if window is None:
                        window = windows[position] = self._window(model, self.metrics[position])
                        assert window is not None
                    if now is None:
                        now = self._clock()
                        slice_id, slice_position = window.slice_at(now)
                    threshold = window.quantile_then_add(quantile, value, now, slice_id, slice_position)
                    if threshold is None or value > threshold:
                        slow = True
        return slow


_RANDOMNESS_BITS = 56
_MAX_THRESHOLD = 1 << _RANDOMNESS_BITS


def randomness_of(trace_id: bytes) -> int:
    """W3C trace-context level 2: the rightmost 56 bits of the trace id are random."""
    return int.from_bytes(trace_id[9:16], "big")


def threshold_for(rate: float) -> int:
    return round((1.0 - rate) * _MAX_THRESHOLD)


def encode_threshold(threshold: int) -> str:
    """OTel ``th`` value: 14 hex digits with trailing zeros removed (``0`` for keep-all)."""
    text = f"{threshold:014x}".rstrip("0")
    return text or "0"


class ProbabilisticPolicy(Policy):
    """Keeps ``rate`` of traces, consistently across replicas: the decision is a function of the trace id."""

    def __init__(self, rate: float, name: str = "probabilistic") -> None:
        self.name = name
        self.rate = rate
        self.threshold = threshold_for(rate)
        self.th = encode_threshold(self.threshold)

    def matches(self, trace: PendingTrace, records: list[RequestRecord]) -> bool:
        return int.from_bytes(trace.trace_id[9:16], "big") >= self.threshold  # randomness_of, inlined


class TokenBucket:
    def __init__(self, per_second: float, clock: Callable[[], float]) -> None:
        self.per_second = per_second
        # A burst of one second's worth, and never less than one token: below 1/s (e.g. 0.2, one trace
        # every 5 s) a bucket capped at ``per_second`` could never hold the token a trace takes.
        self.capacity = max(per_second, 1.0)
        self.tokens = self.capacity
        self._clock = clock
        self._last = clock()

    def take(self) -> bool:
        now = self._clock()
        self.tokens = min(self.capacity, self.tokens + (now - self._last) * self.per_second)
        self._last = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


class RateLimit:
    """Kept traces per second, overall and per model, so one noisy model can't starve the others."""

    def __init__(self, overall: float, per_model: float, applies_to: list[str], max_models: int = 1000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.applies_to = frozenset(applies_to)
        self._clock = clock
        self._overall = TokenBucket(overall, clock) if overall > 0 else None
        self._per_model_rate = per_model
        self._models: dict[str, TokenBucket] = {}
        self._max_models = max_models
        self._lock = threading.Lock()

    def allow(self, policy: str, records: list[RequestRecord]) -> bool:
        if policy not in self.applies_to:
            return True
        with self._lock:
            if self._per_model_rate > 0:
                model = records[0].model if records else "__none__"
                bucket = self._models.get(model)
                if bucket is None:
                    if len(self._models) >= self._max_models:
                        model = "__other__"
                        bucket = self._models.get(model)
                    if bucket is None:
                        bucket = self._models[model] = TokenBucket(self._per_model_rate, self._clock)
                if not bucket.take():
                    return False
            return self._overall is None or self._overall.take()
