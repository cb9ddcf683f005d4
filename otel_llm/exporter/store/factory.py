"""``exporters.store``: kept traces and a row per request into one SQLite file (in the defaults)."""

from __future__ import annotations

from otel_llm.component import CreateSettings, Factory, Kind
from otel_llm.exporter.store.config import StoreExporter
from otel_llm.exporter.store.exporter import StoreComponent


def create(config: StoreExporter, settings: CreateSettings) -> StoreComponent:
    return StoreComponent(settings.name, config)


FACTORY = Factory("store", Kind.EXPORTER, StoreExporter, create, in_defaults=True)
