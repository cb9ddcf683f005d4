"""Privacy by allowlist (``processors.redaction``): text leaves otel-llm only under keys known to be
metadata; what no list names (an instrumentation nobody has seen) is removed, counted by reason."""

from __future__ import annotations

import json

import pytest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from otel_llm.processor.redaction.config import METADATA_KEYS, RedactionProcessor
from otel_llm.processor.redaction.stage import redaction_of
from otel_llm.processor.redaction.synthesis import reduced_url

MARK = "zqx-allowlist-marker-7731"


def _kv(key: str, value: object) -> KeyValue:
    kv = KeyValue(key=key)
    if isinstance(value, bool):
        kv.value.bool_value = value
    elif isinstance(value, int):
        kv.value.int_value = value
    elif isinstance(value, float):
        kv.value.double_value = value
    elif isinstance(value, bytes):
        kv.value.bytes_value = value
    elif isinstance(value, list):
        kv.value.array_value.CopyFrom(ArrayValue(values=[AnyValue(string_value=str(v)) for v in value]))
    elif isinstance(value, dict):
        kv.value.kvlist_value.CopyFrom(KeyValueList(values=[
            KeyValue(key=k, value=AnyValue(string_value=str(v))) for k, v in value.items()]))
    else:
        kv.value.string_value = str(value)
    return kv


def _attrs(span_or_event: object) -> dict[str, AnyValue]:
    return {kv.key: kv.value for kv in span_or_event.attributes}  # type: ignore[attr-defined]


def _unseen_instrumentation_span() -> Span:
    """Every way an instrumentation can put a prompt on a span that no block list names: the shapes
    of Logfire's instrument_openai(version=1) and instrument_openai_agents(), OpenInference's
    openai-agents, and keys nobody has invented yet, in span, event and link attributes."""
    span = Span(name="Chat Completion with 'm'", kind=Span.SPAN_KIND_CLIENT)
    span.attributes.extend([
        _kv("gen_ai.request.model", "m"), _kv("gen_ai.system", "openai"), _kv("gen_ai.operation.name", "chat"),
        _kv("gen_ai.usage.input_tokens", 12), _kv("gen_ai.request.temperature", 0.5), _kv("async", False),
        _kv("gen_ai.response.finish_reasons", ["stop"]), _kv("server.port", 8000),
        _kv("logfire.span_type", "span"),
        # Logfire v1 (llm_providers/openai.py): the request and response as JSON, the message log
        _kv("request_data", json.dumps({"messages": [{"role": "system", "content": f"sys {MARK}"}]})),
        _kv("response_data", json.dumps({"message": {"content": f"answer {MARK}"}})),
        _kv("events", json.dumps([{"event.name": "gen_ai.user.message", "content": MARK}])),
        _kv("logfire.msg", f"Chat Completion with {MARK}"), _kv("logfire.msg_template", f"{MARK} {{x}}"),
        # OpenInference openai-agents: the system prompt in the invocation parameters
        _kv("llm.invocation_parameters", json.dumps({"instructions": f"be brief {MARK}"})),
        # Logfire instrument_openai_agents: raw_input
        _kv("raw_input", [f"hello {MARK}"]),
        # nobody's keys yet: a short string (no length rule catches it), an array, a map, bytes
        _kv("acme.note", MARK), _kv("acme.history", [MARK, "x"]), _kv("acme.ctx", {"p": MARK}),
        _kv("acme.blob", MARK.encode()), _kv("acme.token_ids", [1, 2, 3]),
        _kv("gen_ai.request.stop_sequences", [MARK]),
        # a URL: the query can carry a prompt, the userinfo a secret
        _kv("url.full", f"https://user:pw@api.example:443/v1/chat?q={MARK}#{MARK}"),
    ])
    exception = span.events.add(name="exception")
    exception.attributes.extend([_kv("exception.type", "openai.RateLimitError"), _kv("exception.message", "429"),
                                 _kv("acme.locals", f"prompt={MARK}")])
    content = span.events.add(name="gen_ai.user.message")
    content.attributes.extend([_kv("content", MARK), _kv("role", "user")])
    link = span.links.add(trace_id=b"\x01" * 16, span_id=b"\x02" * 8)
    link.attributes.extend([_kv("acme.why", MARK), _kv("acme.n", 3)])
    return span


def test_text_under_keys_no_list_names_never_leaves():
    span = _unseen_instrumentation_span()
    counts = redaction_of(RedactionProcessor()).apply(span)

    assert MARK.encode() not in span.SerializeToString()
    kept = _attrs(span)
    # metadata text, and every number and boolean, stay as they were
    assert kept["gen_ai.request.model"].string_value == "m"
    assert kept["gen_ai.system"].string_value == "openai"
    assert [v.string_value for v in kept["gen_ai.response.finish_reasons"].array_value.values] == ["stop"]
    assert kept["gen_ai.usage.input_tokens"].int_value == 12
    assert kept["gen_ai.request.temperature"].double_value == 0.5
    assert kept["async"].WhichOneof("value") == "bool_value" and kept["server.port"].int_value == 8000
    assert kept["url.full"].string_value == "https://api.example:443/v1/chat"
    assert set(kept) == {"gen_ai.request.model", "gen_ai.system", "gen_ai.operation.name",
                         "gen_ai.usage.input_tokens", "gen_ai.request.temperature", "async",
                         "gen_ai.response.finish_reasons", "server.port", "logfire.span_type", "url.full"}
    exception, content = span.events
    assert set(_attrs(exception)) == {"exception.type", "exception.message"}
    assert not content.attributes  # a content event: every attribute removed
    assert set(_attrs(span.links[0])) == {"acme.n"}
    # counted by reason: the 13 text values under keys no list names on the span, one in the event, one in the link
    assert counts.not_allowed == 13 + 1 + 1  # span, exception event, link
    assert counts.content_events == 2
    assert counts.url_reduced == 1
    assert counts.content_keys == 0  # none of these keys is on a block list: the allowlist alone removed them


def test_configured_additions_keep_their_text():
    config = RedactionProcessor(allowed_keys=["exception.stacktrace", "acme.note", "tenant.*"])
    span = Span(name="x")
    span.attributes.extend([_kv("acme.note", "kept"), _kv("tenant.id", "t1"), _kv("tenant.plan.name", "gold"),
                            _kv("acme.other", "gone")])
    counts = redaction_of(config).apply(span)
    assert {k: v.string_value for k, v in _attrs(span).items()} == {
        "acme.note": "kept", "tenant.id": "t1", "tenant.plan.name": "gold"}
    assert counts.not_allowed == 1


def test_allow_content_keeps_everything():
    span = _unseen_instrumentation_span()
    before = span.SerializeToString()
    counts = redaction_of(RedactionProcessor(allow_content=True)).apply(span)
    assert span.SerializeToString() == before
    assert counts.not_allowed == counts.content_events == counts.url_reduced == 0


def test_the_block_lists_stay_an_extra_layer():
    """A listed content key is removed even if someone put it on the metadata allowlist."""
    span = Span(name="chat m")
    span.attributes.extend([_kv("gen_ai.input.messages", MARK), _kv("gen_ai.request.model", "m")])
    counts = redaction_of(RedactionProcessor()).apply(span)
    assert set(_attrs(span)) == {"gen_ai.request.model"} and counts.content_keys == 1


def test_no_content_key_is_on_the_metadata_allowlist():
    config = RedactionProcessor()
    redaction = redaction_of(config)
    assert not [key for key in METADATA_KEYS if redaction._blocked(key)]


@pytest.mark.parametrize("url, reduced", [
    ("https://h/p?q=1", "https://h/p"),
    ("https://u:p@h:1/p#f", "https://h:1/p"),
    ("http://h", "http://h"),
    ("/v1/chat?prompt=x", "/v1/chat"),
    ("https://h/a@b?x", "https://h/a@b"),  # an @ in the path is not userinfo
])
def test_reduced_url(url, reduced):
    assert reduced_url(url) == reduced


def _kept_status_and_resource(path: str, redaction_config: RedactionProcessor, status: str,
                              attributes: dict[str, object]) -> tuple[str, dict[str, str], dict[str, str], list[int]]:
    """A kept trace of one span with this status message and attributes, from a resource and a scope
    carrying metadata and a marker each, written by ``path`` ("python": ``kept_trace``; "native": the
    core's writer): (its status message, its resource's and its scope's string attributes, the counts)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
    from opentelemetry.proto.resource.v1.resource_pb2 import Resource

    from otel_llm.internal import core as native_core
    from otel_llm.pdata.spans import BufferedSpan, Origin
    from otel_llm.processor.redaction.synthesis import RedactionCounts, kept_trace, native_kept_trace_writer

    redaction = redaction_of(redaction_config)
    span = Span(trace_id=b"\x01" * 16, span_id=b"\x02" * 8, name="chat m", kind=Span.SPAN_KIND_CLIENT)
    span.attributes.extend(_kv(key, value) for key, value in attributes.items())
    span.status.code = span.status.STATUS_CODE_ERROR
    span.status.message = status
    resource = Resource(attributes=[_kv("service.name", "app"), _kv("host.name", "h1"), _kv("acme.note", MARK)])
    scope = InstrumentationScope(name="acme", version="1", attributes=[_kv("acme.scope", MARK)])
    buffered = [BufferedSpan(span.trace_id, span.span_id, b"", span.kind, 2, 0, 1, "", span.SerializeToString(),
                             Origin(resource, scope, "app", {}), ())]
    if path == "native":
        extension = native_core.select("auto")[0]
        if extension is None:
            pytest.skip("the compiled core is not built")
        built = native_kept_trace_writer(redaction, extension).build(buffered, [], "p", "")
        assert built is not None, "the core declined a plain trace"
        request, counts = ExportTraceServiceRequest.FromString(built[0]), list(built[3])
    else:
        redacted = RedactionCounts()
        request = kept_trace(buffered, [], "p", "", redaction, redacted)[0]
        counts = [count for _, count in redacted.by_reason()]
    (resource_spans,) = request.resource_spans
    (scope_spans,) = resource_spans.scope_spans
    (written,) = scope_spans.spans

    def strings(message: object) -> dict[str, str]:
        return {kv.key: kv.value.string_value for kv in message.attributes}  # type: ignore[attr-defined]

    return written.status.message, strings(resource_spans.resource), strings(scope_spans.scope), counts


PROVIDER_ERROR = f"Error code: 400 - {{'error': {{'message': 'the prompt was: {MARK}'}}}}"


@pytest.mark.parametrize("path", ["python", "native"])
def test_a_status_message_is_reduced_to_the_error_type_and_resources_and_scopes_pass_the_allowlist(path: str) -> None:
    status, resource, scope, counts = _kept_status_and_resource(
        path, RedactionProcessor(), PROVIDER_ERROR, {"error.type": "BadRequestError", "gen_ai.system": "openai"})
    assert status == "BadRequestError"
    assert resource == {"service.name": "app", "host.name": "h1"} and scope == {}
    assert counts == [0, 0, 0, 3, 0]  # not_allowed: the status message, the resource's and the scope's note
    # Without an error.type (or with one that is not text) the message is dropped.
    assert _kept_status_and_resource(path, RedactionProcessor(), PROVIDER_ERROR, {"error.type": 5})[0] == ""
    # Kept where the user allows its key, and with allow_content.
    allowed = RedactionProcessor(allowed_keys=["otel.status_description", "acme.*"])
    assert _kept_status_and_resource(path, allowed, PROVIDER_ERROR, {})[:3] == (
        PROVIDER_ERROR, {"service.name": "app", "host.name": "h1", "acme.note": MARK}, {"acme.scope": MARK})
    assert _kept_status_and_resource(path, RedactionProcessor(allow_content=True), PROVIDER_ERROR, {})[0] == \
        PROVIDER_ERROR
