"""The adapter stage's view of an export request: OTLP with ``Span.attributes`` as a map.

The schema is ``proto/otel_llm/view/v1/trace_view.proto``. It is built here from the installed
``opentelemetry/proto/trace/v1/trace.proto`` descriptor with that one change, so every other field
is upstream's by construction. ``repeated KeyValue attributes = 9`` and ``map<string, AnyValue>
attributes = 9`` are the same bytes on the wire, so the receivers' bytes parse into this view
unchanged; a span's attributes are then upb's hash table, and ``span.attributes.get(key)`` is a
lookup in C rather than a Python dict built from every ``KeyValue`` of every span (~1.3 µs per span
on the bench's workload, ``bench/hotpath.py``).
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

PACKAGE = "otel_llm.view.v1"
FILE_NAME = "otel_llm/view/v1/trace_view.proto"
_UPSTREAM = "opentelemetry.proto.trace.v1"


def _schema() -> descriptor_pb2.FileDescriptorProto:
    schema = descriptor_pb2.FileDescriptorProto()
    trace_pb2.DESCRIPTOR.CopyToProto(schema)
    schema.name = FILE_NAME
    schema.package = PACKAGE
    schema.ClearField("options")
    del schema.enum_type[:]  # SpanFlags: constants only, never a field type
    for index, message in enumerate(schema.message_type):
        if message.name == "TracesData":
            del schema.message_type[index]
            break
    service = descriptor_pb2.FileDescriptorProto()
    trace_service_pb2.DESCRIPTOR.CopyToProto(service)
    request = next(m for m in service.message_type if m.name == "ExportTraceServiceRequest")
    schema.message_type.insert(0, request)
    del schema.dependency[:]
    schema.dependency.extend([common_pb2.DESCRIPTOR.name, "opentelemetry/proto/resource/v1/resource.proto"])

    def retarget(message: descriptor_pb2.DescriptorProto) -> None:
        for field in message.field:
            if field.type_name.startswith(f".{_UPSTREAM}."):
                field.type_name = f".{PACKAGE}." + field.type_name[len(_UPSTREAM) + 2:]
        for nested in message.nested_type:
            retarget(nested)

    for message in schema.message_type:
        retarget(message)
        if message.name == "Span":
            entry = message.nested_type.add(name="AttributesEntry")
            entry.options.map_entry = True
            entry.field.add(name="key", number=1, label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
                            type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING, json_name="key")
            entry.field.add(name="value", number=2, label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
                            type=descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE, json_name="value",
                            type_name=".opentelemetry.proto.common.v1.AnyValue")
            attributes = next(f for f in message.field if f.name == "attributes")
            attributes.type_name = f".{PACKAGE}.Span.AttributesEntry"
    return schema


def _build() -> Any:
    pool = descriptor_pool.Default()
    try:
        file = pool.FindFileByName(FILE_NAME)
    except KeyError:
        pool.Add(_schema())
        file = pool.FindFileByName(FILE_NAME)
    return file


DESCRIPTOR = _build()
ExportTraceServiceRequest: Any = message_factory.GetMessageClass(
    DESCRIPTOR.message_types_by_name["ExportTraceServiceRequest"])
Span: Any = message_factory.GetMessageClass(DESCRIPTOR.message_types_by_name["Span"])
