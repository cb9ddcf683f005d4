"""The callers in front of the engines: an instrumented application and a LiteLLM proxy.

Like ``engines``, these emit through the real OpenTelemetry SDK with explicit timestamps, and the
shapes are not remembered but copied from the real emitters' own output, recorded in
``tests/testdata/emitters`` (``MANIFEST.json`` lists each capture's spans, kinds, attribute keys,
parentage and the package versions; ``capture.py`` regenerates them):

- ``emit_app_client``     the official ``opentelemetry-instrumentation-openai-v2`` on the ``openai``
  client, with or without ``opentelemetry-instrumentation-httpx`` (scenarios ``openai_v2_httpx``
  and ``openai_v2_span_only``)
- ``emit_litellm_proxy``  the LiteLLM proxy's OTel callback with ``forward_traceparent_to_llm_provider``
  (scenario ``litellm_proxy_v1``)

No content attribute is ever emitted (no ``gen_ai.input.messages``/``gen_ai.output.messages``,
no ``llm.openai.messages``/``llm.openai.choices``): the simulator carries no prompt.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from otel_llm_simulate.emitters import SamplingParams

__all__ = [
    "APP_GENAI_SCOPE",
    "APP_GENAI_SCOPE_VERSION",
    "APP_HTTPX_SCOPE",
    "APP_HTTPX_SCOPE_VERSION",
    "FASTAPI_SCOPE",
    "LITELLM_SCOPE",
    "ClientCall",
    "ProxyTimes",
    "emit_app_client",
    "emit_litellm_proxy",
    "openai_error",
]

# openai_v2_httpx / openai_v2_span_only: the GenAI span's scope is the util-genai handler, the HTTP
# span's the httpx instrumentation, each with its package version.
APP_GENAI_SCOPE: Final = "opentelemetry.util.genai.handler"
APP_GENAI_SCOPE_VERSION: Final = "1.1b0"
APP_GENAI_SCHEMA: Final = "https://opentelemetry.io/schemas/1.37.0"
APP_HTTPX_SCOPE: Final = "opentelemetry.instrumentation.httpx"
APP_HTTPX_SCOPE_VERSION: Final = "0.66b2"
APP_HTTPX_SCHEMA: Final = "https://opentelemetry.io/schemas/1.11.0"
# litellm_sdk_v1 / litellm_proxy_v1: LiteLLM's OpenTelemetry logger names its tracer "litellm" (no
# version); the proxy's FastAPI spans come from FastAPI's own tracer.
LITELLM_SCOPE: Final = "litellm"
FASTAPI_SCOPE: Final = "fastapi"
FASTAPI_SCOPE_VERSION: Final = "0.165.0"
FASTAPI_SCHEMA: Final = "https://opentelemetry.io/schemas/1.44.0"

_PROPAGATOR: Final = TraceContextTextMapPropagator()

# What openai 3.57 raises for an HTTP status, and the message openai-v2 puts in the span status
# ("Error code: 500 - ..."). error.type is str() of the class, as the capture shows it.
_OPENAI_ERRORS: Final = {500: "InternalServerError", 502: "InternalServerError", 503: "InternalServerError",
                         400: "BadRequestError", 404: "NotFoundError", 429: "RateLimitError"}


def openai_error(status: int) -> str:
    """``error.type`` on an openai-v2 span for an upstream HTTP ``status`` (``openai_v2_span_only``:
    ``"<class 'openai.InternalServerError'>"``)."""
    return f"<class 'openai.{_OPENAI_ERRORS.get(status, 'APIStatusError')}'>"


def _ctx(span: trace.Span) -> Context:
    return trace.set_span_in_context(span, Context())


def _headers_of(span: trace.Span) -> dict[str, str]:
    headers: dict[str, str] = {}
    _PROPAGATOR.inject(headers, context=_ctx(span))
    return headers


# ---------------------------------------------------------------------------------------------
# The application: openai client + opentelemetry-instrumentation-openai-v2 (+ httpx)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClientCall:
    """One ``chat.completions.create`` as the application sees it (what its CLIENT span records)."""

    start_ns: int
    end_ns: int
    http_start_ns: int  # the httpx POST span (only emitted when httpx is instrumented)
    http_end_ns: int  # non-streaming: response read; streaming: response headers (openai_v2_httpx)
    request_model: str
    stream: bool
    params: SamplingParams
    response_model: str | None = None  # None: the call failed
    response_id: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    finish_reason: str | None = None
    http_status: int = 200
    url: str = "http://llm:8000/v1/chat/completions"

    @property
    def ok(self) -> bool:
        return self.http_status < 400

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


def emit_app_client(
    provider: TracerProvider,
    call: ClientCall,
    *,
    propagate: bool = True,
    upstream_call: Callable[[dict[str, str]], object] | None = None,
    parent_headers: dict[str, str] | None = None,
) -> SpanContext:
    """The application's GenAI CLIENT span ``chat {model}`` and, with ``propagate``, its httpx CLIENT child ``POST``.

    Follows the captures ``openai_v2_httpx`` (``propagate=True``: OpenAIInstrumentor +
    HTTPXClientInstrumentor) and ``openai_v2_span_only`` (``propagate=False``: no HTTP client
    instrumentation, no traceparent leaves the process), made with openai 3.57.0,
    opentelemetry-instrumentation-openai-v2 2.4b0, opentelemetry-util-genai 1.1b0,
    opentelemetry-instrumentation-httpx 0.66b2, opentelemetry-sdk 1.45.2:

    - ``chat {model}``, CLIENT, scope ``opentelemetry.util.genai.handler`` 1.1b0: gen_ai.operation.name,
      gen_ai.provider.name=openai, gen_ai.request.model, the request parameters the call passed
      (max_tokens, temperature, top_p); on success gen_ai.response.model, gen_ai.response.id,
      gen_ai.usage.input_tokens/output_tokens and, for non-streaming calls only,
      gen_ai.response.finish_reasons; on failure error.type (``"<class 'openai.X'>"``) and status
      ERROR with openai's message. The captures carry no server.address/server.port, so neither does this.
    - ``POST``, CLIENT, scope ``opentelemetry.instrumentation.httpx`` 0.66b2, child of the GenAI span:
      http.method, http.url, http.status_code (old HTTP semconv), status ERROR on >= 400 without a
      message. It ends when httpx returns the response: after the body for a plain call, at the
      headers for a stream (the GenAI span lasts until the stream is consumed).

    ``upstream_call(headers)`` runs while the request is in flight; with ``propagate`` the headers
    carry the ``POST`` span's ``traceparent`` (what the upstream receives), otherwise they are
    empty. ``parent_headers`` parents the GenAI span (e.g. the app's own SERVER span); default root.
    No content attribute is emitted.
    """
    tracer = provider.get_tracer(APP_GENAI_SCOPE, APP_GENAI_SCOPE_VERSION, schema_url=APP_GENAI_SCHEMA)
    attributes: dict[str, AttributeValue] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": call.request_model,
        "gen_ai.provider.name": "openai",
    }
    # Set only when the call passed them (the capture's stream call passed no top_p: none on its span).
    if call.params.temperature is not None:
        attributes["gen_ai.request.temperature"] = float(call.params.temperature)
    if call.params.max_tokens is not None:
        attributes["gen_ai.request.max_tokens"] = int(call.params.max_tokens)
    if call.params.top_p is not None:
        attributes["gen_ai.request.top_p"] = float(call.params.top_p)
    parent = Context()
    if parent_headers:
        parent = _PROPAGATOR.extract({k.lower(): v for k, v in parent_headers.items()}, context=Context())
    span = tracer.start_span(f"chat {call.request_model}", context=parent, kind=SpanKind.CLIENT,
                             attributes=attributes, start_time=call.start_ns)
    try:
        headers: dict[str, str] = {}
        http_span = None
        if propagate:
            httpx_tracer = provider.get_tracer(APP_HTTPX_SCOPE, APP_HTTPX_SCOPE_VERSION, schema_url=APP_HTTPX_SCHEMA)
            http_span = httpx_tracer.start_span("POST", context=_ctx(span), kind=SpanKind.CLIENT,
                                                attributes={"http.method": "POST", "http.url": call.url},
                                                start_time=call.http_start_ns)
            headers = _headers_of(http_span)
        try:
            if upstream_call is not None:
                upstream_call(headers)
        finally:
            if http_span is not None:
                http_span.set_attribute("http.status_code", call.http_status)
                if call.http_status >= 400:
                    http_span.set_status(Status(StatusCode.ERROR))
                http_span.end(end_time=call.http_end_ns)
        if call.ok:
            done: dict[str, AttributeValue] = {}
            if call.response_model is not None:
                done["gen_ai.response.model"] = call.response_model
            if call.response_id is not None:
                done["gen_ai.response.id"] = call.response_id
            if call.input_tokens is not None:
                done["gen_ai.usage.input_tokens"] = int(call.input_tokens)
            if call.output_tokens is not None:
                done["gen_ai.usage.output_tokens"] = int(call.output_tokens)
            if call.finish_reason is not None and not call.stream:
                done["gen_ai.response.finish_reasons"] = [call.finish_reason]
            span.set_attributes(done)
        else:
            span.set_attribute("error.type", openai_error(call.http_status))
            span.set_status(Status(StatusCode.ERROR, f"Error code: {call.http_status} - upstream error"))
    finally:
        span.end(end_time=call.end_ns)
    return span.get_span_context()


# ---------------------------------------------------------------------------------------------
# The LiteLLM proxy (callbacks: ["otel"], forward_traceparent_to_llm_provider: true)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProxyTimes:
    """Where the proxy's spans start and end (ns), in the order ``litellm_proxy_v1`` shows them."""

    server: tuple[int, int]  # FastAPI's SERVER span, the outermost
    received: tuple[int, int]  # LiteLLM's SERVER span "Received Proxy Server Request"
    auth: tuple[int, int]
    pre_call: tuple[int, int]
    router: tuple[int, int]  # router "acompletion", around the call
    deployment: tuple[int, int]  # router "async_get_available_deployment"
    request: tuple[int, int]  # litellm_request and its raw_gen_ai_request child; ends with "received"
    self_call: tuple[int, int]  # "self": the HTTP call to the upstream

    @property
    def duration_s(self) -> float:
        return (self.server[1] - self.server[0]) / 1e9


def _span(tracer: trace.Tracer, name: str, parent: Context, interval: tuple[int, int],
          attributes: Mapping[str, AttributeValue] | None = None, kind: SpanKind = SpanKind.INTERNAL,
          status: Status | None = None) -> trace.Span:
    span = tracer.start_span(name, context=parent, kind=kind, attributes=attributes, start_time=interval[0])
    if status is not None:
        span.set_status(status)
    span.end(end_time=interval[1])
    return span


_OK: Final = Status(StatusCode.OK)


def emit_litellm_proxy(
    provider: TracerProvider,
    times: ProxyTimes,
    *,
    model: str,
    caller_headers: dict[str, str] | None,
    upstream_call: Callable[[dict[str, str]], object] | None = None,
    stream: bool = False,
    params: SamplingParams = SamplingParams(),
    upstream_response_model: str | None = None,
    response_id: str | None = None,
    input_tokens: int | None = None,
    output_tokens: int | None = None,
    finish_reason: str | None = None,
    call_id: str = "00000000-0000-4000-8000-000000000000",
    server_address: str = "litellm",
    server_port: int = 4000,
    route: str = "/v1/chat/completions",
) -> SpanContext:
    """A LiteLLM proxy with its OTel callback and ``forward_traceparent_to_llm_provider: true``, a model
    group ``model`` routed to ``openai/<model>`` (the upstream engine), answered successfully.

    Follows the capture ``litellm_proxy_v1`` (litellm 1.110.2 proxy, fastapi 0.165.0, opentelemetry-sdk
    1.45.2; calls ``chat_tp``/``stream_tp``, with a caller traceparent). Its spans, all in one resource:

    - ``POST {route}``, SERVER, scope ``fastapi`` 0.165.0: http.request.method, http.response.status_code,
      http.route, network.protocol.version, server.address/port, url.path, url.scheme; no model. Its
      INTERNAL children ``fastapi.dependencies``, ``fastapi.endpoint`` (and ``fastapi.serialization``
      for a non-streaming response), with code.function.name;
    - ``Received Proxy Server Request``, SERVER, scope ``litellm``: http.response.status_code,
      http.route, url.path; no model. With a caller traceparent both SERVER spans are children of
      the CALLER's span (siblings of each other);
    - under it, scope ``litellm``, all INTERNAL: ``auth``, ``proxy_pre_call``, ``router``
      (acompletion), ``router`` (async_get_available_deployment), ``self`` (the upstream HTTP call),
      each with call_type/service, and ``litellm_request``: gen_ai.operation.name (``"acompletion"``:
      what LiteLLM's proxy writes), gen_ai.system, gen_ai.request.model (the model group),
      gen_ai.request.max_tokens/temperature, gen_ai.response.model (the model group again),
      gen_ai.response.id, gen_ai.usage.input/output/total_tokens, gen_ai.response.finish_reasons
      (a JSON string), http.route, litellm.cache_hit, litellm.call_id, litellm.model_group,
      litellm.provider.model, llm.is_streaming, llm.request.type; status OK;
    - ``raw_gen_ai_request``, INTERNAL, child of ``litellm_request``, same interval: ``llm.openai.*``
      (the upstream's own model and id for a non-streaming call; stream/stream_options for a stream),
      including ``llm.openai.extra_headers`` with the forwarded traceparent.

    Content keys of the capture (gen_ai.input.messages/output.messages, llm.openai.messages/choices)
    and the large metadata.*/hidden_params values are not emitted. The proxy forwards the caller's
    ``traceparent`` (not its tracestate) verbatim: ``upstream_call`` receives it, so the engine span
    is a SIBLING of the two SERVER spans (same parent, the caller's span), not their child.
    """
    tracer = provider.get_tracer(LITELLM_SCOPE)
    fastapi = provider.get_tracer(FASTAPI_SCOPE, FASTAPI_SCOPE_VERSION, schema_url=FASTAPI_SCHEMA)
    parent = Context()
    forwarded: dict[str, str] = {}
    if caller_headers:
        carrier = {k.lower(): v for k, v in caller_headers.items() if k.lower() in ("traceparent", "tracestate")}
        parent = _PROPAGATOR.extract(carrier, context=Context())
        if "traceparent" in carrier:
            forwarded = {"traceparent": carrier["traceparent"]}
    server = fastapi.start_span(
        f"POST {route}", context=parent, kind=SpanKind.SERVER, start_time=times.server[0],
        attributes={"http.request.method": "POST", "http.route": route, "network.protocol.version": "1.1",
                    "server.address": server_address, "server.port": server_port, "url.path": route,
                    "url.scheme": "http"})
    received = tracer.start_span("Received Proxy Server Request", context=parent, kind=SpanKind.SERVER,
                                 start_time=times.received[0])
    in_received = _ctx(received)
    try:
        function = {"code.function.name": "litellm.proxy.proxy_server.chat_completion"}
        _span(fastapi, "fastapi.dependencies", _ctx(server), (times.server[0] + 500_000, times.auth[1] + 100_000),
              function)
        _span(tracer, "auth", in_received, times.auth, {"call_type": route, "service": "auth"}, status=_OK)
        _span(tracer, "proxy_pre_call", in_received, times.pre_call,
              {"call_type": "add_litellm_data_to_request", "service": "proxy_pre_call"}, status=_OK)
        _span(tracer, "router", in_received, times.deployment,
              {"call_type": "async_get_available_deployment", "service": "router"}, status=_OK)
        if upstream_call is not None:
            upstream_call(dict(forwarded))
        _span(tracer, "self", in_received, times.self_call,
              {"call_type": "make_openai_chat_completion_request <- track_llm_api_timing", "service": "self"},
              status=_OK)
        attrs: dict[str, AttributeValue] = {"gen_ai.operation.name": "acompletion", "gen_ai.system": "openai",
                                            "gen_ai.request.model": model}
        if params.max_tokens is not None:
            attrs["gen_ai.request.max_tokens"] = int(params.max_tokens)
        if params.temperature is not None:
            attrs["gen_ai.request.temperature"] = float(params.temperature)
        if finish_reason is not None:
            attrs["gen_ai.response.finish_reasons"] = json.dumps([finish_reason])
        if response_id is not None:
            attrs["gen_ai.response.id"] = response_id
        attrs["gen_ai.response.model"] = model  # the proxy answers with the model group's name
        if input_tokens is not None and output_tokens is not None:
            attrs.update({"gen_ai.usage.input_tokens": int(input_tokens),
                          "gen_ai.usage.output_tokens": int(output_tokens),
                          "gen_ai.usage.total_tokens": int(input_tokens) + int(output_tokens)})
        attrs.update({"http.route": route, "litellm.cache_hit": False, "litellm.call_id": call_id,
                      "litellm.model_group": model, "litellm.provider.model": f"openai/{model}",
                      "llm.is_streaming": str(stream), "llm.request.type": "acompletion"})
        request = tracer.start_span("litellm_request", context=in_received, kind=SpanKind.INTERNAL,
                                    attributes=attrs, start_time=times.request[0])
        raw: dict[str, AttributeValue] = {"llm.openai.extra_body": "{}"}
        if forwarded:
            raw["llm.openai.extra_headers"] = repr(forwarded)
        if params.max_tokens is not None:
            raw["llm.openai.max_tokens"] = int(params.max_tokens)
        if stream:
            raw.update({"llm.openai.model": model, "llm.openai.stream": True,
                        "llm.openai.stream_options": "{'include_usage': True}"})
        else:
            raw.update({"llm.openai.model": upstream_response_model or model, "llm.openai.object": "chat.completion"})
            if response_id is not None:
                raw["llm.openai.id"] = response_id
        if params.temperature is not None:
            raw["llm.openai.temperature"] = float(params.temperature)
        _span(tracer, "raw_gen_ai_request", _ctx(request), times.request, raw, status=_OK)
        request.set_status(_OK)
        request.end(end_time=times.request[1])
        _span(tracer, "router", in_received, times.router, {"call_type": "acompletion", "service": "router"},
              status=_OK)
    finally:
        received.set_attributes({"http.response.status_code": 200, "http.route": route, "url.path": route})
        received.set_status(_OK)
        received.end(end_time=times.received[1])
        endpoint_end = times.server[1] - 700_000
        _span(fastapi, "fastapi.endpoint", _ctx(server), (times.auth[1] + 200_000, endpoint_end), function)
        if not stream:
            _span(fastapi, "fastapi.serialization", _ctx(server), (endpoint_end + 90_000, endpoint_end + 150_000),
                  function)
        server.set_attribute("http.response.status_code", 200)
        server.end(end_time=times.server[1])
    return received.get_span_context()
