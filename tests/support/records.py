"""Records as the compiled core builds them, for tests that compare the core's readers with Python's."""

from __future__ import annotations

from typing import Any

from otel_llm.pdata.records import RequestRecord


def as_core_record(record: RequestRecord, extension: Any) -> Any:
    """``record``'s fields in the core's ``RequestRecord`` (``rust/src/record.rs``): what its
    ``RecordBuilder`` returns, read by index where the core reads a record."""
    return extension.RequestRecord(*(getattr(record, name) for name in extension.RequestRecord.FIELDS))
