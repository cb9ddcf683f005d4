"""A kept-trace consumer that batches kept traces into export requests and sends them through a
queued, retrying exporter (``TraceExporter``): what ``exporters.otlp`` and ``exporters.otlphttp`` share."""

from __future__ import annotations

from otel_llm.component import Host
from otel_llm.exporter.exporterhelper.batcher import ExportBatcher
from otel_llm.exporter.exporterhelper.queued_exporter import TraceExporter
from otel_llm.exporter.otlp.config import OtlpTraceExporter
from otel_llm.pdata.records import KeptTrace


class QueuedTraceExporter:
    def __init__(self, name: str, protocol: str, config: OtlpTraceExporter) -> None:
        self.name = name
        self.protocol = protocol
        self.config = config
        self.exporter: TraceExporter | None = None
        self._batcher: ExportBatcher | None = None

    def start(self, host: Host) -> None:
        exporter = TraceExporter(self.name, self.protocol, self.config, host.registry)
        exporter.start()  # OSError: the on-disk queue cannot be used
        host.readiness.append(exporter.problem)
        queue = self.config.sending_queue
        self.exporter = exporter
        self._batcher = ExportBatcher(exporter.submit, max_spans=queue.batch_max_spans, max_delay_s=queue.batch_timeout)

    def consume(self, kept: KeptTrace) -> bool:
        assert self._batcher is not None, "consume before start"
        return self._batcher.add(kept.serialized, kept.spans)

    def flush(self, only_if_due: bool) -> None:
        if self._batcher is not None:
            self._batcher.flush(only_if_due)

    def shutdown(self, grace_s: float) -> None:
        if self._batcher is not None:
            self._batcher.flush(False)
        if self.exporter is not None:
            self.exporter.shutdown(grace_s)
