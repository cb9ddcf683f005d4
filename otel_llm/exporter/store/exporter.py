"""The store as a kept-trace consumer: opened by ``start``, written by its own thread."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from otel_llm.component import Host
from otel_llm.exporter.store.config import StoreExporter
from otel_llm.exporter.store.sqlite import DB_NAME, StoreReader, TraceStore
from otel_llm.pdata.records import KeptTrace


class StoreComponent:
    def __init__(self, name: str, config: StoreExporter) -> None:
        self.name = name
        self.config = config
        self.store: TraceStore | None = None

    @property
    def path(self) -> Path:
        return Path(self.config.path) / DB_NAME

    def reader(self) -> StoreReader:
        return StoreReader(self.store.path if self.store is not None else self.path)

    def start(self, host: Host) -> None:
        config = self.config
        store = TraceStore(Path(config.path), config.retention, config.max_size_mib * 1024 * 1024, config.queue_size,
                           host.registry, block_s=config.max_block, commit_interval_s=config.commit_interval)
        try:
            store.start()
        except (OSError, sqlite3.Error) as exc:
            raise OSError(f"path: cannot open {store.path}: {exc}") from None
        self.store = store

    def consume(self, kept: KeptTrace) -> bool:
        assert self.store is not None, "consume before start"
        # Given the rows, the store does not read the request (the core's bytes then stay unparsed).
        request = kept.request if kept.span_rows is None else None
        return self.store.submit(request, kept.records, kept.policy, kept.span_rows, spans=kept.spans)

    def flush(self, only_if_due: bool) -> None:
        """The writer commits on its own (``commit_interval``): nothing is batched here."""

    def wait_written(self, timeout_s: float = 10.0) -> bool:
        """Until every kept trace consumed so far is written (or dropped, counted)."""
        return self.store.flush(timeout_s) if self.store is not None else True

    def problem(self) -> str | None:
        return self.store.problem() if self.store is not None else None

    def shutdown(self, grace_s: float) -> None:
        if self.store is not None:
            self.store.shutdown(grace_s)
