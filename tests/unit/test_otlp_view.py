"""The adapter stage's view of OTLP (``otel_llm/pdata/otlp_view.py``): the schema it builds is the one
``proto/otel_llm/view/v1/trace_view.proto`` declares, the real OTel SDK exporter's bytes parse into it
with every attribute, and a re-serialized span is the same span to plain OTLP."""

from __future__ import annotations

import re
from pathlib import Path

from google.protobuf.descriptor import FieldDescriptor
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode

from otel_llm.pdata import otlp_view
from otel_llm.pdata.attributes import any_value_to_python
from otel_llm.processor.llm_metrics.config import LlmMetricsProcessor
from otel_llm.processor.llm_metrics.digest import digest_in_process, digest_settings
from otel_llm.processor.redaction.config import RedactionProcessor

SCHEMA = Path(__file__).resolve().parents[2] / "proto" / "otel_llm" / "view" / "v1" / "trace_view.proto"
_TYPES = {"bytes": FieldDescriptor.TYPE_BYTES, "string": FieldDescriptor.TYPE_STRING,
          "fixed32": FieldDescriptor.TYPE_FIXED32, "fixed64": FieldDescriptor.TYPE_FIXED64,
          "uint32": FieldDescriptor.TYPE_UINT32}


def _declared_fields(text: str) -> dict[str, dict[str, tuple[str, int]]]:
    """{message path: {field: (type as written, number)}} of the .proto file, nested messages included."""
    out: dict[str, dict[str, tuple[str, int]]] = {}
    stack: list[str] = []
    for line in text.splitlines():
        line = line.split("//", 1)[0].strip()
        opened = re.match(r"(message|enum) (\w+) \{", line)
        if opened:
            stack.append(opened.group(2) if opened.group(1) == "message" else "")
            if opened.group(1) == "message":
                out[".".join(s for s in stack if s)] = {}
            continue
        if line == "}":
            stack.pop()
            continue
        field = re.match(r"(repeated )?(map<[^>]+>|[\w.]+) (\w+) = (\d+);", line)
        if field and stack and stack[-1]:
            out[".".join(stack)][field.group(3)] = ((field.group(1) or "") + field.group(2), int(field.group(4)))
    return out


def _message_path(descriptor) -> str:
    return descriptor.full_name.removeprefix(otlp_view.PACKAGE + ".")


def test_the_built_schema_is_the_one_the_proto_file_declares():
    declared = _declared_fields(SCHEMA.read_text())
    built: dict[str, dict[str, tuple[str, int]]] = {}

    def visit(message) -> None:
        if message.GetOptions().map_entry:
            return
        fields: dict[str, tuple[str, int]] = {}
        for field in message.fields:
            if field.message_type is not None and field.message_type.GetOptions().map_entry:
                key, value = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
                assert key.type == FieldDescriptor.TYPE_STRING
                written = f"map<string, {value.message_type.full_name}>"
            elif field.message_type is not None or field.enum_type is not None:
                target = field.message_type or field.enum_type
                name = target.full_name
                written = _message_path(target).split(".")[-1] if name.startswith(otlp_view.PACKAGE) else name
            else:
                written = next(k for k, v in _TYPES.items() if v == field.type)
            repeated = field.is_repeated and not (
                field.message_type is not None and field.message_type.GetOptions().map_entry)
            fields[field.name] = (("repeated " if repeated else "") + written, field.number)
        built[_message_path(message)] = fields
        for nested in message.nested_types:
            visit(nested)

    for message in otlp_view.DESCRIPTOR.message_types_by_name.values():
        visit(message)
    assert built == declared
    assert built["Span"]["attributes"] == ("map<string, opentelemetry.proto.common.v1.AnyValue>", 9)
    # Every other field of the upstream Span, with its number, is there.
    upstream = {f.name: f.number for f in Span.DESCRIPTOR.fields}
    assert {name: number for name, (_, number) in built["Span"].items()} == upstream


def _sdk_request() -> bytes:
    """Spans made by the OTel SDK and encoded by its OTLP exporter's encoder: the bytes engines send."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "vllm"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("vllm.engine")
    with tracer.start_as_current_span("gateway", kind=SpanKind.SERVER, attributes={"http.route": "/v1/chat/completions"}):
        with tracer.start_as_current_span("llm_request", kind=SpanKind.SERVER, attributes={
                "gen_ai.request.model": "m", "gen_ai.latency.e2e": 1.5, "gen_ai.usage.prompt_tokens": 12,
                "flag": True, "list": ["a", "b"], "numbers": [1, 2], "gen_ai.response.finish_reasons": ["stop"]}) as span:
            span.add_event("token_generated", {"i": 1})
            span.set_status(Status(StatusCode.ERROR, "boom"))
    provider.shutdown()
    return encode_spans(exporter.get_finished_spans()).SerializeToString()


def test_the_sdk_exporters_bytes_read_the_same_through_the_view():
    data = _sdk_request()
    upstream = ExportTraceServiceRequest.FromString(data)
    view = otlp_view.ExportTraceServiceRequest.FromString(data)
    plain = [s for rs in upstream.resource_spans for ss in rs.scope_spans for s in ss.spans]
    viewed = [s for rs in view.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert len(plain) == len(viewed) == 2
    for original, seen in zip(plain, viewed):
        assert {kv.key: any_value_to_python(kv.value) for kv in original.attributes} == \
            {key: any_value_to_python(value) for key, value in seen.attributes.items()}
        assert (seen.trace_id, seen.span_id, seen.parent_span_id, seen.name, seen.kind, seen.status.code,
                seen.start_time_unix_nano, seen.end_time_unix_nano, len(seen.events)) == \
            (original.trace_id, original.span_id, original.parent_span_id, original.name, original.kind,
             original.status.code, original.start_time_unix_nano, original.end_time_unix_nano, len(original.events))
        # Re-serialized from the view, plain OTLP reads the same span (attributes in another order).
        back = Span.FromString(seen.SerializeToString())
        assert sorted(back.attributes, key=lambda kv: kv.key) == sorted(original.attributes, key=lambda kv: kv.key)
        back.ClearField("attributes")
        copy = Span()
        copy.CopyFrom(original)
        copy.ClearField("attributes")
        assert back == copy
    assert view.resource_spans[0].resource == upstream.resource_spans[0].resource


def test_a_duplicate_key_reads_as_its_last_value():
    span = Span(name="llm_request")
    for value in ("first", "last"):
        kv = span.attributes.add(key="gen_ai.request.model")
        kv.value.string_value = value
    seen = otlp_view.Span.FromString(span.SerializeToString())
    assert len(seen.attributes) == 1 and seen.attributes["gen_ai.request.model"].string_value == "last"


def test_over_the_attribute_limit_the_first_ones_received_are_kept():
    request = ExportTraceServiceRequest()
    span = request.resource_spans.add().scope_spans.add().spans.add(
        trace_id=b"\x01" * 16, span_id=b"\x02" * 8, name="app", kind=Span.SPAN_KIND_INTERNAL,
        start_time_unix_nano=1, end_time_unix_nano=2)
    keys = [f"key.{i:03d}" for i in range(80)]
    for key in reversed(keys):  # received in an order no hash table keeps
        span.attributes.add(key=key).value.int_value = 1
    settings = digest_settings(LlmMetricsProcessor(), RedactionProcessor(max_attributes_per_span=16))
    (buffered,), counts = digest_in_process(request, settings)
    assert counts.truncated == 1
    kept = [kv.key for kv in Span.FromString(buffered.payload).attributes]
    assert kept == list(reversed(keys))[:16]
