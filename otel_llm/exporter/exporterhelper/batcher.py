"""Kept traces batched into export requests, as the Collector's batch processor does: one request
per trace would make the sending queue's bound (in requests) meaningless under a burst of decisions
(a shutdown drains thousands at once) and cost a round trip per trace."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

Submit = Callable[[ExportTraceServiceRequest], bool]


class ExportBatcher:
    def __init__(self, submit: Submit, max_spans: int = 2048, max_delay_s: float = 0.2,
                 on_dropped: Callable[[int], None] = lambda spans: None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._submit = submit
        self._max_spans = max_spans
        self._max_delay_s = max_delay_s
        self._on_dropped = on_dropped
        self._clock = clock
        self._lock = threading.Lock()
        self._batch = ExportTraceServiceRequest()
        self._spans = 0
        self._opened_at = 0.0

    def add(self, request: ExportTraceServiceRequest | bytes, spans: int) -> bool:
        """Queue a kept trace (the message, or its bytes: their resource spans are appended all the
        same); returns True (a full batch that the exporter refuses is counted there)."""
        ready = None
        with self._lock:
            if self._spans == 0:
                self._opened_at = self._clock()
            if isinstance(request, bytes):
                self._batch.MergeFromString(request)
            else:
                self._batch.resource_spans.extend(request.resource_spans)
            self._spans += spans
            if self._spans >= self._max_spans:
                ready = self._take()
        if ready is not None:
            self._send(*ready)
        return True

    def flush(self, only_if_due: bool = False) -> None:
        with self._lock:
            if self._spans == 0 or (only_if_due and self._clock() - self._opened_at < self._max_delay_s):
                return
            ready = self._take()
        self._send(*ready)

    def _take(self) -> tuple[ExportTraceServiceRequest, int]:
        batch, spans = self._batch, self._spans
        self._batch, self._spans = ExportTraceServiceRequest(), 0
        return batch, spans

    def _send(self, batch: ExportTraceServiceRequest, spans: int) -> None:
        if not self._submit(batch):
            self._on_dropped(spans)
