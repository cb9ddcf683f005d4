"""The real emitters' OTLP requests (``tests/testdata/emitters``, made by its ``capture.py``), replayed.

Times are shifted to now as one block, so every duration, and every interval relation between
spans, stays exactly as the emitter sent it; ids are kept, so a capture replays once per server.
"""

from __future__ import annotations

import json
import time
import urllib.request
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from tests.support.otelllm import RunningServer

CAPTURES = Path(__file__).resolve().parent.parent / "testdata" / "emitters"
MARKERS = ("PROMPT-MARKER-7f3a", "COMPLETION-MARKER-9c1e", "SYSTEM-MARKER-5b2d")


@cache
def manifest() -> dict[str, Any]:
    return json.loads((CAPTURES / "MANIFEST.json").read_text())


def scenario(name: str) -> dict[str, Any]:
    return manifest()["scenarios"][name]


def trace_requests(name: str) -> list[ExportTraceServiceRequest]:
    requests = []
    for file_name in scenario(name)["files"]:
        request = ExportTraceServiceRequest()
        request.ParseFromString((CAPTURES / file_name).read_bytes())
        requests.append(request)
    return requests


def spans_of(requests: list[ExportTraceServiceRequest]) -> list[Span]:
    return [span for request in requests for rs in request.resource_spans for ss in rs.scope_spans
            for span in ss.spans]


def earliest_start_ns(requests: list[ExportTraceServiceRequest]) -> int:
    return min(span.start_time_unix_nano for span in spans_of(requests))


def shifted(requests: list[ExportTraceServiceRequest], offset_ns: int) -> list[ExportTraceServiceRequest]:
    out = []
    for request in requests:
        copy = ExportTraceServiceRequest()
        copy.CopyFrom(request)
        for span in spans_of([copy]):
            span.start_time_unix_nano += offset_ns
            span.end_time_unix_nano += offset_ns
            for event in span.events:
                event.time_unix_nano += offset_ns
        out.append(copy)
    return out


def attribute(span: Span, key: str) -> Any:
    for kv in span.attributes:
        if kv.key == key:
            return _python(kv.value)
    return None


def _python(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_python(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


def duration_s(span: Span) -> float:
    return (span.end_time_unix_nano - span.start_time_unix_nano) / 1e9


def post(server: RunningServer, request: ExportTraceServiceRequest) -> int:
    """One OTLP/HTTP protobuf POST, as the emitters' own exporter sent it."""
    http = urllib.request.Request(f"http://127.0.0.1:{server.http_port}/v1/traces", data=request.SerializeToString(),
                                  headers={"Content-Type": "application/x-protobuf"}, method="POST")
    with urllib.request.urlopen(http, timeout=10) as response:
        return int(response.status)


@dataclass
class Replay:
    requests: list[ExportTraceServiceRequest]  # as sent, times shifted
    offset_ns: int

    @property
    def spans(self) -> list[Span]:
        return spans_of(self.requests)

    def named(self, name: str) -> list[Span]:
        return [span for span in self.spans if span.name == name]


def replay(server: RunningServer, name: str, *, start_ns: int | None = None) -> Replay:
    requests = trace_requests(name)
    offset = (start_ns if start_ns is not None else time.time_ns()) - earliest_start_ns(requests)
    moved = shifted(requests, offset)
    for request in moved:
        assert post(server, request) == 200
    return Replay(moved, offset)
