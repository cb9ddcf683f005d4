"""OTLP trace fixtures for engines that cannot be installed here.

Every builder returns an ``ExportTraceServiceRequest`` (opentelemetry.proto) whose
span names, kinds, attribute keys and value types, event names, parent/child
structure and units are the ones the engine's source code uses.  The docstring of
each builder cites repository, file, lines and the commit the fact was read from;
``[PR]`` marks a fact known only from a pull-request text, ``[I]`` an inference,
``UNVERIFIED`` something no stored source showed.  See
``tests/testdata/engines/FACTS.md`` for the same facts as tables.

Timing parameters are seconds (floats) so tests can compute expected metrics;
timestamps are built from ``t0_ns`` (wall-clock ns of the first instant).
The ``mutate_*`` helpers at the end make malformed / partial variants.

Snapshot commits read (``git -C /work/.mirror/<repo>/repo log -1``):

* triton-inference-server/server  ``e1db8a603d863b1317ee859bdeea2be19959462e`` (2026-08-19)
* triton-inference-server/core    ``73aad7c3348d040c7087d57837d75822c488495e`` (2026-06-09)
* triton-inference-server/tensorrtllm_backend ``0b9d7d5a195820d53abadfcf7208d0ccdbfd5332``
  (2026-07-14; the backend source is the ``tensorrt_llm`` submodule =
  NVIDIA/TensorRT-LLM ``triton_backend/``)
* llm-d/llm-d-router ``ebab687927f5331c1b39defcb579a07951bce56c`` (2026-08-22)
* vLLM, TensorRT-LLM, Dynamo, SGLang were too large to fetch (> 500 MiB); single files
  were read from the code index at the commit given per builder.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any, Iterable, Mapping, Sequence

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import (
    AnyValue,
    ArrayValue,
    InstrumentationScope,
    KeyValue,
)
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

SERVER = Span.SpanKind.SPAN_KIND_SERVER
CLIENT = Span.SpanKind.SPAN_KIND_CLIENT
INTERNAL = Span.SpanKind.SPAN_KIND_INTERNAL

T0_NS = 1_764_583_200_000_000_000  # 2025-12-01T10:00:00Z

# vLLM's bucket family for inter-token latency (vllm/v1/metrics/buckets.py, v0.33.0;
# see shared/research/engine-spans.md 2.1) - for span-derived ITL from token events.
VLLM_INTER_TOKEN_LATENCY_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
    7.5, 10.0, 20.0, 40.0, 80.0,
)


# ---------------------------------------------------------------------------
# low-level helpers
# ---------------------------------------------------------------------------
def any_value(v: Any) -> AnyValue:
    if isinstance(v, AnyValue):
        return v
    if isinstance(v, bool):
        return AnyValue(bool_value=v)
    if isinstance(v, int):
        return AnyValue(int_value=v)
    if isinstance(v, float):
        return AnyValue(double_value=v)
    if isinstance(v, str):
        return AnyValue(string_value=v)
    if isinstance(v, (list, tuple)):
        return AnyValue(array_value=ArrayValue(values=[any_value(x) for x in v]))
    raise TypeError(f"unsupported attribute value {v!r}")


def kv(attrs: Mapping[str, Any] | None) -> list[KeyValue]:
    return [KeyValue(key=k, value=any_value(v)) for k, v in (attrs or {}).items() if v is not None]


def _id(seed: str, n: int) -> bytes:
    return hashlib.sha256(seed.encode()).digest()[:n]


def trace_id(seed: str, bits64: bool = False) -> bytes:
    """128-bit id; ``bits64`` gives SGLang-style ids (upper 64 bits zero)."""
    tid = _id("trace:" + seed, 16)
    return b"\0" * 8 + tid[8:] if bits64 else tid


def span_id(seed: str) -> bytes:
    return _id("span:" + seed, 8)


def ns(t0_ns: int, seconds: float) -> int:
    return t0_ns + int(round(seconds * 1e9))


def event(name: str, t_ns: int, attrs: Mapping[str, Any] | None = None) -> Span.Event:
    return Span.Event(name=name, time_unix_nano=t_ns, attributes=kv(attrs))


def make_span(
    name: str,
    *,
    trace: bytes,
    sid: bytes,
    parent: bytes | None,
    kind: int,
    start_ns: int,
    end_ns: int,
    attrs: Mapping[str, Any] | None = None,
    events: Iterable[Span.Event] = (),
    links: Iterable[tuple[bytes, bytes]] = (),
    status_code: int = Status.StatusCode.STATUS_CODE_UNSET,
    status_message: str = "",
) -> Span:
    return Span(
        trace_id=trace,
        span_id=sid,
        parent_span_id=parent or b"",
        name=name,
        kind=kind,
        start_time_unix_nano=start_ns,
        end_time_unix_nano=end_ns,
        attributes=kv(attrs),
        events=list(events),
        links=[Span.Link(trace_id=t, span_id=s) for t, s in links],
        status=Status(code=status_code, message=status_message),
    )


def resource_spans(resource: Mapping[str, Any], scope: str, spans: Sequence[Span],
                   scope_version: str = "") -> ResourceSpans:
    return ResourceSpans(
        resource=Resource(attributes=kv(resource)),
        scope_spans=[ScopeSpans(scope=InstrumentationScope(name=scope, version=scope_version),
                                spans=list(spans))],
    )


def request(*rs: ResourceSpans) -> ExportTraceServiceRequest:
    return ExportTraceServiceRequest(resource_spans=list(rs))


def all_spans(req: ExportTraceServiceRequest) -> list[Span]:
    return [s for r in req.resource_spans for ss in r.scope_spans for s in ss.spans]


def attr_value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [attr_value(v) for v in value.array_value.values]
    return getattr(value, which) if which else None


def span_attrs(span: Span) -> dict[str, Any]:
    return {a.key: attr_value(a.value) for a in span.attributes}


# ---------------------------------------------------------------------------
# vLLM - newest span shape
# ---------------------------------------------------------------------------
def vllm_request_span(
    *,
    model: str = "Qwen/Qwen3-0.6B",
    operation: str = "chat",
    span_name_style: str = "operation_model",
    token_keys: str = "new",
    finish_reasons: Sequence[str] = ("stop",),
    finish_reasons_as: str = "json_string",
    prompt_tokens: int = 32,
    cached_tokens: int | None = 16,
    preprocess_s: float = 0.004,
    queue_s: float = 0.020,
    prefill_s: float = 0.050,
    decode_steps: Sequence[float] = (0.010,) * 7,
    tokens_per_step: Sequence[int] | None = None,
    detokenize_s: float = 0.001,
    token_events: bool = True,
    hide_token_ids: bool = False,
    max_events: int = 128,
    waiting_size: int = 0,
    batch_size: int = 4,
    request_id: str = "chatcmpl-7f3a9c",
    parent: tuple[bytes, bytes] | None = None,
    t0_ns: int = T0_NS,
    seed: str = "vllm",
) -> ExportTraceServiceRequest:
    """vLLM's per-request span, in the shape it is moving to.

    Base (what main emits): ``OutputProcessor.do_tracing``,
    vllm-project/vllm ``vllm/v1/engine/output_processor.py`` @ ``d07822605346f767b672503c9aae85aa23ef2d82``
    (``do_tracing``, near the end of the file): ``instrument_manual(span_name="llm_request",
    start_time=int(arrival_time*1e9), kind=SpanKind.SERVER, context=trace_context)``; attributes
    ``gen_ai.latency.time_to_first_token`` (= ``first_token_latency``), ``gen_ai.latency.e2e``
    (= ``iteration_timestamp - arrival_time``), ``gen_ai.latency.time_in_queue``
    (= ``scheduled_ts - queued_ts``), ``gen_ai.latency.time_in_model_prefill``
    (= ``first_token_ts - scheduled_ts``), ``..._decode`` (= ``last_token_ts - first_token_ts``),
    ``..._inference`` (= ``last_token_ts - scheduled_ts``), ``gen_ai.usage.prompt_tokens``,
    ``gen_ai.usage.completion_tokens``, ``gen_ai.request.id`` (external id),
    ``gen_ai.response.finish_reasons`` = ``json.dumps([str(finish_reason)])`` (a JSON **string**),
    and ``top_p`` / ``max_tokens`` / ``temperature`` / ``n`` only when truthy.  Key strings:
    ``vllm/tracing/utils.py`` @ ``0bf3270fe12361d1f31f8955f17e5bc5dde6780e`` (``SpanAttributes``).
    Scope ``vllm.tracing.otel``, resource ``vllm.instrumenting_module_name`` /
    ``vllm.process_id`` (``vllm/tracing/otel.py`` @ ``40eeb0c5e942e511bf73359f99265d72470c2f59``,
    ``init_tracer``).

    Not on main (built from PR texts; no PR diff was in the store):

    * vllm#47633 (open) [PR]: span name ``"{operation} {model}"``, attributes
      ``gen_ai.operation.name`` and ``gen_ai.request.model``.  ``span_name_style="llm_request"``
      gives the name main uses.  Operation values follow the GenAI semconv
      (``chat``, ``text_completion``, ``embeddings``) [I].
    * vllm#40799 (open) [PR]: ``gen_ai.usage.input_tokens`` / ``output_tokens`` replace
      ``prompt_tokens`` / ``completion_tokens``; ``gen_ai.usage.cache_read.input_tokens``;
      finish reasons.  vllm#54476 (open) [PR]: ``gen_ai.usage.cache_read.input_tokens`` from
      ``num_cached_tokens``.  ``token_keys``: ``"new"``, ``"old"`` or ``"both"``;
      ``finish_reasons_as``: ``"json_string"`` (main) or ``"array"`` (semconv).
    * vllm#32573 (open): per-token events, from the PR-branch file
      ``vllm/v1/engine/observable_context.py`` @ ``5a0a83ebe720aa04a78e3530d08820c1a4b6596b``
      (``ObservableContext._update_iter_stats``): per engine step with new tokens, an event
      ``token_scheduled`` {``iter_batch_size``, ``iter_waiting_size``} at
      ``token_scheduled_time`` and ``token_generated`` {``new_token_ids`` (int array),
      ``iter_waiting_size``, ``iter_total_tokens_count``} at ``token_output_time``.
      ``VLLM_TRACE_HIDE_TOKEN_IDS`` drops ``new_token_ids`` (``vllm/tracing/utils.py``
      ``HIDE_TOKEN_IDS``).  Events past the SDK span limit (``OTEL_SPAN_EVENT_COUNT_LIMIT``,
      default 128) are dropped by the SDK [I, SDK behaviour].  The exact name of the
      per-token attribute on the span and the conversion of ``token_output_time`` to ns are
      UNVERIFIED (``do_tracing`` of the PR branch was not in the store); events here use ns.

    Timing: arrival = ``t0``; queued at ``t0+preprocess_s``; scheduled after ``queue_s``; first
    token after ``prefill_s``; then one decode step per ``decode_steps`` entry (each emits
    ``tokens_per_step[i]`` tokens, default 1); the span ends ``detokenize_s`` after the last
    token (``iteration_timestamp``).  TTFT = preprocess+queue+prefill; e2e = all of it.
    """
    steps = list(decode_steps)
    tps = list(tokens_per_step) if tokens_per_step is not None else [1] * len(steps)
    assert len(tps) == len(steps)
    trace = parent[0] if parent else trace_id(seed)
    sid = span_id(seed + ":span")
    queued = preprocess_s
    scheduled = queued + queue_s
    first_tok = scheduled + prefill_s
    t = first_tok
    step_ends = []
    for d in steps:
        t += d
        step_ends.append(t)
    last_tok = t
    end = last_tok + detokenize_s
    completion_tokens = 1 + sum(tps)

    attrs: dict[str, Any] = {
        "gen_ai.latency.time_to_first_token": first_tok,
        "gen_ai.latency.e2e": end,
        "gen_ai.latency.time_in_queue": queue_s,
    }
    if token_keys in ("old", "both"):
        attrs["gen_ai.usage.prompt_tokens"] = prompt_tokens
        attrs["gen_ai.usage.completion_tokens"] = completion_tokens
    if token_keys in ("new", "both"):
        attrs["gen_ai.usage.input_tokens"] = prompt_tokens
        attrs["gen_ai.usage.output_tokens"] = completion_tokens
    attrs.update({
        "gen_ai.latency.time_in_model_prefill": prefill_s,
        "gen_ai.latency.time_in_model_decode": last_tok - first_tok,
        "gen_ai.latency.time_in_model_inference": last_tok - scheduled,
        "gen_ai.request.id": request_id,
        "gen_ai.response.finish_reasons": (
            json.dumps(list(finish_reasons)) if finish_reasons_as == "json_string"
            else list(finish_reasons)),
        "gen_ai.request.top_p": 0.9,
        "gen_ai.request.max_tokens": 256,
        "gen_ai.request.temperature": 0.7,
    })
    if span_name_style == "operation_model":
        attrs["gen_ai.operation.name"] = operation
        attrs["gen_ai.request.model"] = model
        name = f"{operation} {model}"
    else:
        name = "llm_request"
    if cached_tokens is not None:
        attrs["gen_ai.usage.cache_read.input_tokens"] = cached_tokens

    events = []
    if token_events:
        # first token: the prefill step; then one per decode step
        step_windows = [(scheduled, first_tok, 1)] + [
            (step_ends[i] - steps[i], step_ends[i], tps[i]) for i in range(len(steps))]
        total = prompt_tokens
        tok = 1000
        for start, out, n in step_windows:
            total += n
            events.append(event("token_scheduled", ns(t0_ns, start),
                                {"iter_batch_size": batch_size, "iter_waiting_size": waiting_size}))
            gen_attrs: dict[str, Any] = {}
            if not hide_token_ids:
                gen_attrs["new_token_ids"] = list(range(tok, tok + n))
            tok += n
            gen_attrs.update({"iter_waiting_size": waiting_size, "iter_total_tokens_count": total})
            events.append(event("token_generated", ns(t0_ns, out), gen_attrs))
        events = events[:max_events]

    span = make_span(name, trace=trace, sid=sid, parent=parent[1] if parent else None,
                     kind=SERVER, start_ns=t0_ns, end_ns=ns(t0_ns, end), attrs=attrs,
                     events=events)
    return request(resource_spans(
        {"service.name": "vllm", "vllm.instrumenting_module_name": "vllm.llm_engine",
         "vllm.process_id": "4242"},
        "vllm.tracing.otel", [span]))


# ---------------------------------------------------------------------------
# Triton Inference Server (OpenTelemetry mode)
# ---------------------------------------------------------------------------
TRITON_RESOURCE = {"service.name": "triton-inference-server", "telemetry.sdk.language": "cpp",
                   "telemetry.sdk.name": "opentelemetry"}
TRITON_SCOPE = "triton-server"


class _TritonTrace:
    """Builds spans the way ``TraceManager::Trace`` does (server ``src/tracer.cc``)."""

    def __init__(self, seed: str, t0_ns: int, parent: tuple[bytes, bytes] | None):
        self.seed = seed
        self.t0 = t0_ns
        self.trace = parent[0] if parent else trace_id(seed)
        self.remote_parent = parent[1] if parent else None
        self.spans: list[Span] = []
        self.n = 0

    def new_sid(self) -> bytes:
        self.n += 1
        return span_id(f"{self.seed}:{self.n}")

    def model_span(self, model: str, parent_sid: bytes, triton_trace_id: int,
                   triton_parent_id: int, request_start: float, queue_start: float,
                   request_end: float, version: int = 1, request_id: str = "",
                   missing: Sequence[str] = ()) -> bytes:
        sid = self.new_sid()
        evs = [("REQUEST_START", request_start), ("QUEUE_START", queue_start),
               ("REQUEST_END", request_end)]
        attrs = {"triton.model_name": model, "triton.model_version": version,
                 "triton.trace_id": triton_trace_id, "triton.trace_parent_id": triton_parent_id}
        if request_id:
            attrs["triton.request_id"] = request_id
        self.spans.append(make_span(
            model, trace=self.trace, sid=sid, parent=parent_sid, kind=SERVER,
            start_ns=ns(self.t0, request_start), end_ns=ns(self.t0, request_end), attrs=attrs,
            events=[event(n, ns(self.t0, t)) for n, t in evs if n not in missing]))
        return sid

    def compute_span(self, parent_sid: bytes, compute_start: float, input_end: float,
                     output_start: float, compute_end: float, missing: Sequence[str] = ()) -> bytes:
        sid = self.new_sid()
        evs = [("COMPUTE_START", compute_start), ("COMPUTE_INPUT_END", input_end),
               ("COMPUTE_OUTPUT_START", output_start), ("COMPUTE_END", compute_end)]
        self.spans.append(make_span(
            "compute", trace=self.trace, sid=sid, parent=parent_sid, kind=SERVER,
            start_ns=ns(self.t0, compute_start), end_ns=ns(self.t0, compute_end),
            events=[event(n, ns(self.t0, t)) for n, t in evs if n not in missing]))
        return sid


def _triton_root_events(protocol: str, t: Mapping[str, float], responses: Sequence[float]
                        ) -> list[tuple[str, float]]:
    if protocol == "http":
        # http_server.cc:3312-3313 (RECV, captured before the trace exists),
        # 3961-3963 / 4565-4566 (SEND); INFER_RESPONSE_COMPLETE at 4054-4055 (infer, one
        # response) or 4429-4430 (generate / generate_stream: EVERY response callback).
        evs = [("HTTP_RECV_START", t["recv_start"]), ("HTTP_RECV_END", t["recv_end"])]
        evs += [("INFER_RESPONSE_COMPLETE", r) for r in responses]
        evs += [("HTTP_SEND_START", t["send_start"]), ("HTTP_SEND_END", t["send_end"])]
        return evs
    # grpc/infer_handler.cc:677-817 (unary), stream_infer_handler.cc:121/211 (WAITREAD),
    # 480/522 (SEND_END), 676-680 (INFER_RESPONSE_COMPLETE only when cb_count_ == 1, i.e.
    # the FIRST response); buffered in trace_timestamps_ and flushed onto the root span by
    # ClearTraceTimestamps (infer_handler.h:1201-1209) when the state is released.
    evs = [("GRPC_WAITREAD_START", t["recv_start"]), ("GRPC_WAITREAD_END", t["recv_end"])]
    evs += [("INFER_RESPONSE_COMPLETE", responses[0])] if responses else []
    evs += [("GRPC_SEND_START", t["send_start"]), ("GRPC_SEND_END", t["send_end"])]
    return evs


def triton_request(
    *,
    model: str = "tensorrt_llm",
    protocol: str = "grpc_stream",
    recv_s: float = 0.0005,
    overhead_s: float = 0.0003,
    queue_s: float = 0.002,
    input_s: float = 0.0004,
    engine_s: float = 0.400,
    output_s: float = 0.0002,
    release_s: float = 0.0003,
    send_s: float = 0.0004,
    first_response_s: float | None = 0.060,
    n_responses: int = 20,
    request_id: str = "",
    parent: tuple[bytes, bytes] | None = None,
    missing_events: Sequence[str] = (),
    t0_ns: int = T0_NS,
    seed: str = "triton",
) -> ExportTraceServiceRequest:
    """One top-level Triton request on one model (e.g. the TensorRT-LLM backend).

    Sources: triton-inference-server/server ``src/tracer.cc`` @ ``e1db8a60`` (file last
    changed ``25baa7b33e68ba5a1220433c70d447777ef91288``):

    * root span ``InferRequest`` started in ``TraceManager::SampleTrace`` (tracer.cc:348-352) at
      trace creation, ended when the Trace is destroyed (tracer.cc:363-370); parent = the
      extracted W3C context (tracer.cc:300-312, which also forces sampling).
    * every span kind SERVER (tracer.cc:594-595); scope ``triton-server`` (tracer.h:83
      ``kTritonTracer``); times ``time_offset_ + steady ns`` (tracer.cc:596-599).
    * frontend timestamps become events on the root (``CaptureTimestamp``, tracer.cc:378-405).
    * model span named after the model, started on ``REQUEST_START`` (tracer.cc:655-684) with
      ``triton.model_name`` (string), ``triton.model_version`` (int64),
      ``triton.trace_id`` / ``triton.trace_parent_id`` (uint64 -> int) and
      ``triton.request_id`` only if the client set one (tracer.cc:566-581); events
      ``REQUEST_START``, ``QUEUE_START``, ``REQUEST_END`` on it; ends at ``REQUEST_END``
      (tracer.cc:689-695).
    * ``compute`` span, child of the model span, started on ``COMPUTE_START``
      (tracer.cc:680-681), events ``COMPUTE_START``, ``COMPUTE_INPUT_END``,
      ``COMPUTE_OUTPUT_START``, ``COMPUTE_END``; ends at ``COMPUTE_END``.

    Activity names: triton-inference-server/core ``src/tritonserver.cc:933-954`` @ ``73aad7c3``.
    REQUEST_START at ``src/server.cc:581-584``; QUEUE_START at ``src/dynamic_batch_scheduler.cc:194-202``;
    COMPUTE_* from the backend's ``TRITONBACKEND_ModelInstanceReportStatistics(exec_start,
    compute_start, compute_end, exec_end)`` -> ``COMPUTE_START=exec_start,
    COMPUTE_INPUT_END=compute_start, COMPUTE_OUTPUT_START=compute_end, COMPUTE_END=exec_end``
    (``src/backend_model_instance.cc:986-1000``, ``src/infer_request.cc:1507-1522``);
    REQUEST_END on request release (``src/infer_request.cc:496-504``).

    TensorRT-LLM backend (``model="tensorrt_llm"``): NVIDIA/TensorRT-LLM
    ``triton_backend/inflight_batcher_llm/src/model_instance_state.cc`` @
    ``c8c6df08bd0ead54cd47f7973e1e425c28a174cd`` (``reportBaseMetrics``): statistics are reported
    once, after the final response, with ``exec_start`` = enqueue entry, ``compute_start`` =
    before ``enqueueRequests``, ``compute_end`` = the response batch carrying the final
    response, ``exec_end`` = in ``reportBaseMetrics``.  So ``COMPUTE_INPUT_END ->
    COMPUTE_OUTPUT_START`` (``engine_s``) is the whole executor time = executor queue +
    prefill + decode, with no split and no first-token time.

    Timeline (seconds from t0): recv ``[0, recv_s]``; root start = ``recv_s``; REQUEST_START =
    root + ``overhead_s``; QUEUE_START = REQUEST_START + 0; COMPUTE_START = QUEUE_START +
    ``queue_s``; INPUT_END + ``input_s``; OUTPUT_START + ``engine_s``; COMPUTE_END +
    ``output_s``; REQUEST_END + ``release_s``; SEND + ``send_s``; root end = SEND_END.
    ``first_response_s`` is measured from REQUEST_START (streaming decoupled model; ``None``
    = no response event); HTTP generate gets ``n_responses`` INFER_RESPONSE_COMPLETE events.
    ``missing_events`` drops events by name (partial variants).
    """
    tt = _TritonTrace(seed, t0_ns, parent)
    root_sid = tt.new_sid()
    t = {"recv_start": 0.0, "recv_end": recv_s}
    req_start = recv_s + overhead_s
    queue_start = req_start
    c_start = queue_start + queue_s
    c_in = c_start + input_s
    c_out = c_in + engine_s
    c_end = c_out + output_s
    req_end = c_end + release_s
    t["send_start"] = req_end
    t["send_end"] = req_end + send_s
    responses: list[float] = []
    if first_response_s is not None:
        first = req_start + first_response_s
        if protocol == "http":
            step = (c_out - first) / max(1, n_responses - 1)
            responses = [first + i * step for i in range(n_responses)]
        else:
            responses = [first]
    proto = "http" if protocol == "http" else "grpc"
    root_events = [event(n, ns(t0_ns, x)) for n, x in _triton_root_events(proto, t, responses)
                   if n not in missing_events]
    model_sid = tt.model_span(model, root_sid, 1, 0, req_start, queue_start, req_end,
                              request_id=request_id, missing=missing_events)
    if "COMPUTE" not in missing_events:
        tt.compute_span(model_sid, c_start, c_in, c_out, c_end, missing=missing_events)
    root = make_span("InferRequest", trace=tt.trace, sid=root_sid, parent=tt.remote_parent,
                     kind=SERVER, start_ns=ns(t0_ns, recv_s), end_ns=ns(t0_ns, t["send_end"]),
                     events=root_events)
    return request(resource_spans(TRITON_RESOURCE, TRITON_SCOPE, [root] + tt.spans))


def triton_ensemble(
    *,
    ensemble: str = "ensemble",
    steps: Sequence[tuple[str, float, float]] = (
        ("preprocessing", 0.0005, 0.003),
        ("tensorrt_llm", 0.002, 0.400),
        ("postprocessing", 0.0003, 0.002),
    ),
    protocol: str = "grpc_stream",
    first_response_s: float | None = 0.070,
    t0_ns: int = T0_NS,
    seed: str = "triton-ensemble",
) -> ExportTraceServiceRequest:
    """An ensemble request (one client request, one ``InferRequest`` root).

    ``steps`` = (composing model, queue seconds, compute seconds), run in sequence.
    The ensemble's own span gets REQUEST_START / QUEUE_START (core
    ``src/ensemble_scheduler/ensemble_scheduler.cc:1624-1632``) / REQUEST_END but **no
    compute child**: the ensemble reports ``ReportStatisticsWithDuration``
    (ensemble_scheduler.cc:134), which emits no trace activity (core
    ``src/infer_request.cc:1553-1590``).  Each composing request gets a child trace
    (``SpawnChildTrace``, ensemble_scheduler.cc:1130) whose ``triton.trace_parent_id`` is the
    ensemble's ``triton.trace_id``; its model span's parent is the top of the parent trace's
    span stack = the ensemble model span (server tracer.cc:547-564, 590-608).
    Counts as ONE request.
    """
    tt = _TritonTrace(seed, t0_ns, None)
    root_sid = tt.new_sid()
    recv_s, overhead = 0.0005, 0.0003
    ens_start = recv_s + overhead
    ens_sid_placeholder = tt.new_sid()
    cursor = ens_start + 0.0001
    child_spans = []
    for i, (m, q, c) in enumerate(steps):
        rs = cursor
        cs = rs + q
        ce = cs + c
        re_ = ce + 0.0002
        child_id = tt.model_span(m, ens_sid_placeholder, 2 + i, 1, rs, rs, re_)
        tt.compute_span(child_id, cs, cs + 0.0001, ce - 0.0001, ce)
        child_spans.append((m, rs, re_))
        cursor = re_ + 0.0001
    ens_end = cursor
    send_end = ens_end + 0.0004
    ens = make_span(ensemble, trace=tt.trace, sid=ens_sid_placeholder, parent=root_sid,
                    kind=SERVER, start_ns=ns(t0_ns, ens_start), end_ns=ns(t0_ns, ens_end),
                    attrs={"triton.model_name": ensemble, "triton.model_version": 1,
                           "triton.trace_id": 1, "triton.trace_parent_id": 0},
                    events=[event("REQUEST_START", ns(t0_ns, ens_start)),
                            event("QUEUE_START", ns(t0_ns, ens_start)),
                            event("REQUEST_END", ns(t0_ns, ens_end))])
    t = {"recv_start": 0.0, "recv_end": recv_s, "send_start": ens_end, "send_end": send_end}
    responses = [ens_start + first_response_s] if first_response_s is not None else []
    root = make_span("InferRequest", trace=tt.trace, sid=root_sid, parent=None, kind=SERVER,
                     start_ns=ns(t0_ns, recv_s), end_ns=ns(t0_ns, send_end),
                     events=[event(n, ns(t0_ns, x)) for n, x in _triton_root_events(
                         "http" if protocol == "http" else "grpc", t, responses)])
    return request(resource_spans(TRITON_RESOURCE, TRITON_SCOPE, [root, ens] + tt.spans))


def triton_bls(
    *,
    bls_model: str = "tensorrt_llm_bls",
    child_model: str = "tensorrt_llm",
    children: int = 1,
    child_engine_s: float = 0.300,
    t0_ns: int = T0_NS,
    seed: str = "triton-bls",
) -> ExportTraceServiceRequest:
    """A BLS (python_backend) model that calls ``child_model`` ``children`` times.

    Child requests are traced only when the Python model passes ``trace=request.trace()``
    to ``pb_utils.InferenceRequest`` (shared/research/engines-2026.md 1.2 [V there]); their
    ``triton.trace_parent_id`` is the BLS request's ``triton.trace_id`` and their model span's
    parent is the BLS model span (server tracer.cc:547-564).  The BLS model's own ``compute``
    span comes from python_backend's statistics, reported after execution, so it is a
    sibling of the child model spans and covers them in time [I from core
    infer_request.cc:1507-1522: COMPUTE_* are reported together].  Counts as ONE request.
    """
    tt = _TritonTrace(seed, t0_ns, None)
    root_sid = tt.new_sid()
    recv_s = 0.0005
    req_start = recv_s + 0.0003
    c_start = req_start + 0.001
    cursor = c_start + 0.002
    bls_sid = span_id(f"{seed}:bls")
    for i in range(children):
        rs = cursor
        cs = rs + 0.001
        ce = cs + child_engine_s
        re_ = ce + 0.0002
        sid = tt.model_span(child_model, bls_sid, 2 + i, 1, rs, rs, re_)
        tt.compute_span(sid, cs, cs + 0.0002, ce - 0.0001, ce)
        cursor = re_ + 0.001
    c_end = cursor
    req_end = c_end + 0.0002
    bls_compute = tt.compute_span(bls_sid, c_start, c_start + 0.0005, c_end - 0.0005, c_end)
    del bls_compute
    bls = make_span(bls_model, trace=tt.trace, sid=bls_sid, parent=root_sid, kind=SERVER,
                    start_ns=ns(t0_ns, req_start), end_ns=ns(t0_ns, req_end),
                    attrs={"triton.model_name": bls_model, "triton.model_version": 1,
                           "triton.trace_id": 1, "triton.trace_parent_id": 0},
                    events=[event("REQUEST_START", ns(t0_ns, req_start)),
                            event("QUEUE_START", ns(t0_ns, req_start)),
                            event("REQUEST_END", ns(t0_ns, req_end))])
    t = {"recv_start": 0.0, "recv_end": recv_s, "send_start": req_end, "send_end": req_end + 0.0004}
    root = make_span("InferRequest", trace=tt.trace, sid=root_sid, parent=None, kind=SERVER,
                     start_ns=ns(t0_ns, recv_s), end_ns=ns(t0_ns, t["send_end"]),
                     events=[event(n, ns(t0_ns, x)) for n, x in _triton_root_events(
                         "http", t, [req_end - 0.0001])])
    return request(resource_spans(TRITON_RESOURCE, TRITON_SCOPE, [root, bls] + tt.spans))


# ---------------------------------------------------------------------------
# TensorRT-LLM trtllm-serve
# ---------------------------------------------------------------------------
def trtllm_serve_span(
    *,
    span_name: str = "llm_request",
    prompt_tokens: int = 64,
    completion_tokens: int = 32,
    queue_s: float = 0.015,
    ttft_s: float = 0.080,
    e2e_s: float = 0.600,
    kv_cache_transfer_s: float | None = None,
    finish_reasons: Sequence[str] = ("stop",),
    finish_reasons_as: str = "array",
    not_measured: Sequence[str] = (),
    request_id: str = "trtllm-42",
    parent: tuple[bytes, bytes] | None = None,
    kv_events: tuple[float, float] | None = None,
    t0_ns: int = T0_NS,
    seed: str = "trtllm",
    service: str = "trtllm-serve",
) -> ExportTraceServiceRequest:
    """The per-request span of ``trtllm-serve --otlp_traces_endpoint``.

    Keys: NVIDIA/TensorRT-LLM ``tensorrt_llm/llmapi/tracing.py`` @
    ``0fb7f7586fda3d4c584a608332c8d498a425d9b1`` (``SpanAttributes``, ``SpanEvents``):
    ``gen_ai.usage.completion_tokens``, ``gen_ai.usage.prompt_tokens``,
    ``gen_ai.request.max_tokens`` / ``top_p`` / ``top_k`` / ``temperature`` / ``id`` / ``n``,
    ``gen_ai.latency.time_to_first_token``, ``gen_ai.latency.e2e``,
    ``gen_ai.latency.time_in_queue``, ``gen_ai.latency.kv_cache_transfer_time``,
    ``gen_ai.response.finish_reasons``; events ``kv_cache_transfer_start``,
    ``kv_cache_transfer_end``, ``ctx_server.selected``, ``gen_server.selected``
    (same list in PR NVIDIA/TensorRT-LLM#5897's description).  Values come from
    ``metrics_dict`` defaulting to **-1** when a metric is missing (PR #5897 diff as quoted in
    shared/research/engines-2026.md 1.5 [PR]); ``not_measured`` lists latency keys to set to
    -1.  Requires ``return_perf_metrics: true`` (TRT-LLM OpenTelemetry guide, ibid.).
    ``finish_reasons``: the OpenAI-server tracing test (code-index id 3668537786) only asserts
    ``len(...) > 0`` after decoding arrays, so array vs JSON string is UNVERIFIED;
    ``finish_reasons_as`` = ``"array"`` (default, per the research note) or ``"json_string"``.
    The same test asserts exactly one span per request in the export.
    Tracer ``"trt.llm"`` [PR].  Kind SERVER (``trace_span`` in tracing.py creates SERVER
    spans; the request span is modelled the same) [I].

    UNVERIFIED: the per-request span **name** (``do_tracing`` is not in the index; the module
    is adapted from vLLM v0.10.0rc1, whose span is ``llm_request``) - match by attributes.
    No ``time_in_model_prefill/decode/inference`` and no ``gen_ai.response.model``.
    A newer ``tensorrt_llm/llmapi/otel_tracing.py`` @ ``3b904c6ad46e2a223aa27292a21c375fa489a02d``
    drops ``top_k``, ``finish_reasons`` and ``kv_cache_transfer_time`` from ``SpanAttributes``.

    ``kv_events``: (start, end) seconds of the KV transfer -> ``kv_cache_transfer_start/end``
    events (their attributes are UNVERIFIED; none are set).
    """
    trace = parent[0] if parent else trace_id(seed)
    lat = {"gen_ai.latency.time_to_first_token": ttft_s, "gen_ai.latency.e2e": e2e_s,
           "gen_ai.latency.time_in_queue": queue_s}
    if kv_cache_transfer_s is not None:
        lat["gen_ai.latency.kv_cache_transfer_time"] = kv_cache_transfer_s
    for k in not_measured:
        lat[k] = -1
    attrs = {
        "gen_ai.usage.completion_tokens": completion_tokens,
        "gen_ai.usage.prompt_tokens": prompt_tokens,
        "gen_ai.request.max_tokens": 128,
        "gen_ai.request.top_p": 0.95,
        "gen_ai.request.temperature": 0.8,
        "gen_ai.request.id": request_id,
        "gen_ai.request.n": 1,
        **lat,
        "gen_ai.response.finish_reasons": (list(finish_reasons) if finish_reasons_as == "array"
                                           else json.dumps(list(finish_reasons))),
    }
    evs = []
    if kv_events:
        evs = [event("kv_cache_transfer_start", ns(t0_ns, kv_events[0])),
               event("kv_cache_transfer_end", ns(t0_ns, kv_events[1]))]
    span = make_span(span_name, trace=trace, sid=span_id(seed + ":req"),
                     parent=parent[1] if parent else None, kind=SERVER, start_ns=t0_ns,
                     end_ns=ns(t0_ns, e2e_s), attrs=attrs, events=evs)
    return request(resource_spans({"service.name": service}, "trt.llm", [span]))


def trtllm_serve_disaggregated(
    *,
    ctx_ttft_s: float = 0.090,
    gen_queue_s: float = 0.004,
    kv_transfer_s: float = 0.012,
    gen_e2e_s: float = 0.500,
    proxy_span_name: str = "openai_chat_completion",
    t0_ns: int = T0_NS,
    seed: str = "trtllm-disagg",
) -> ExportTraceServiceRequest:
    """Disaggregated trtllm-serve: proxy span with ``ctx_server.selected`` /
    ``gen_server.selected`` events, a context-server request span and a generation-server
    request span carrying ``gen_ai.latency.kv_cache_transfer_time`` and the
    ``kv_cache_transfer_start/end`` events (names: ``tensorrt_llm/llmapi/tracing.py`` @
    ``0fb7f758``).  The proxy span is a ``@trace_span`` SERVER span named after the serving
    function (``trace_span`` in the same file); the function name
    (``proxy_span_name``) is UNVERIFIED, as is the exact parentage of the worker spans (both
    extract the proxy's injected headers, ``inject_trace_headers`` in the same file) [I].
    Counts as ONE request.
    """
    trace = trace_id(seed)
    proxy_sid = span_id(seed + ":proxy")
    ctx = trtllm_serve_span(parent=(trace, proxy_sid), ttft_s=ctx_ttft_s, e2e_s=ctx_ttft_s,
                            completion_tokens=1, queue_s=0.006, t0_ns=ns(t0_ns, 0.001),
                            seed=seed + ":ctx", service="trtllm-serve-ctx",
                            finish_reasons=("length",))
    gen_start = 0.001 + ctx_ttft_s + 0.002
    kv_start = gen_start + gen_queue_s
    gen = trtllm_serve_span(parent=(trace, proxy_sid), queue_s=gen_queue_s,
                            ttft_s=gen_queue_s + kv_transfer_s + 0.001, e2e_s=gen_e2e_s,
                            kv_cache_transfer_s=kv_transfer_s,
                            kv_events=(kv_start - gen_start, kv_start - gen_start + kv_transfer_s),
                            t0_ns=ns(t0_ns, gen_start), seed=seed + ":gen",
                            service="trtllm-serve-gen")
    end = gen_start + gen_e2e_s + 0.001
    proxy = make_span(proxy_span_name, trace=trace, sid=proxy_sid, parent=None, kind=SERVER,
                      start_ns=t0_ns, end_ns=ns(t0_ns, end),
                      events=[event("ctx_server.selected", ns(t0_ns, 0.0005)),
                              event("gen_server.selected", ns(t0_ns, gen_start - 0.0005))],
                      status_code=Status.StatusCode.STATUS_CODE_OK)
    out = request(resource_spans({"service.name": "trtllm-disagg-proxy"}, "trt.llm", [proxy]))
    out.resource_spans.extend(ctx.resource_spans)
    out.resource_spans.extend(gen.resource_spans)
    return out


# ---------------------------------------------------------------------------
# NVIDIA Dynamo
# ---------------------------------------------------------------------------
def _dynamo_worker(trace: bytes, route_sid: bytes, seed: str, t0_ns: int, start: float,
                   end: float, role: str, model: str, input_tokens: int, output_tokens: int,
                   ttft_ms: float | None, finish_reason: str, instance_id: int,
                   component: str, links: Sequence[tuple[bytes, bytes]] = (),
                   engine_child: bool = True) -> tuple[ResourceSpans, bytes]:
    hp_sid = span_id(seed + ":handle_payload")
    eg_sid = span_id(seed + ":engine.generate")
    hp = make_span("handle_payload", trace=trace, sid=hp_sid, parent=route_sid, kind=SERVER,
                   start_ns=ns(t0_ns, start), end_ns=ns(t0_ns, end),
                   attrs={"trace_id": trace.hex(), "parent_id": route_sid.hex(),
                          "trace_flags": "01", "x_request_id": "req-abc",
                          "request_id": "7c1e0d2a-dyn", "component": component,
                          "endpoint": "generate", "namespace": "dynamo",
                          "instance_id": instance_id})
    eg_attrs: dict[str, Any] = {"disagg_role": role, "model": model, "input_tokens": input_tokens,
                                "output_tokens": output_tokens, "finish_reason": finish_reason}
    if ttft_ms is not None:
        eg_attrs["ttft_ms"] = ttft_ms
    eg = make_span("engine.generate", trace=trace, sid=eg_sid, parent=hp_sid, kind=INTERNAL,
                   start_ns=ns(t0_ns, start + 0.0002), end_ns=ns(t0_ns, end - 0.0001),
                   attrs=eg_attrs, links=links)
    spans = [hp, eg]
    rs = resource_spans({"service.name": f"dynamo-{component}"}, "dynamo", spans)
    return rs, eg_sid


def dynamo_request(
    *,
    model: str = "Qwen/Qwen3-0.6B",
    disaggregated: bool = False,
    preprocess_s: float = 0.003,
    route_s: float = 0.001,
    prefill_s: float = 0.080,
    kv_transfer_s: float = 0.010,
    decode_s: float = 0.400,
    input_tokens: int = 48,
    output_tokens: int = 40,
    outcome: str = "success",
    t0_ns: int = T0_NS,
    seed: str = "dynamo",
) -> ExportTraceServiceRequest:
    """Dynamo frontend -> router -> worker, aggregated or disaggregated (two workers).

    * ``http-request`` (frontend, no ``otel.kind`` -> INTERNAL), fields ``method``, ``uri``,
      ``version``, ``trace_id``, ``parent_id``, ``trace_flags``, ``x_request_id``,
      ``request_id``, and recorded later ``model``, ``request.outcome``, ``input_tokens``,
      ``output_tokens``, ``image_count``/``video_count``/``audio_count``, **``ttft_ms``**,
      **``avg_itl_ms``**, ``prefill_worker_id``, ``decode_worker_id``:
      ai-dynamo/dynamo ``lib/runtime/src/logging.rs`` (``make_inference_request_span``;
      stored version ``b4d7ad4595b9f507ed0ac09173966fc0cb88b2cf``).  Values are recorded by
      ``Span::record``; the numeric types (here: ints for tokens and worker ids, doubles for
      ``*_ms``) are UNVERIFIED.
    * ``router.route_request`` CLIENT, one per hop, attributes ``request.attempt`` = ``"0"``,
      ``migration.is_retry`` = ``"false"`` (strings!), ``request.outcome`` =
      ``"success"``/``"cancelled"``: asserted by ``tests/frontend/test_unified_worker_otlp_export.py``
      (stored ``691ebda32abbc25bbdbd3d37f9262de05c47707c``), which also asserts root
      ``request.outcome`` ``"cancelled"`` and status UNSET on cancellation, and a worker event
      ``request cancellation received``.
    * ``handle_payload`` with ``otel.kind = "server"`` -> SERVER, fields ``trace_id``,
      ``parent_id``, ``trace_flags``, ``x_request_id``, ``request_id``, ``tracestate``,
      ``component``, ``endpoint``, ``namespace``, ``instance_id`` (logging.rs
      ``make_handle_payload_span``), remote child of ``router.route_request`` (test above).
    * ``engine.generate`` (unified backend auto-span), child of ``handle_payload``, attributes
      ``disagg_role`` (``agg``/``prefill``/``decode``), ``model``, ``input_tokens`` (test above)
      and ``ttft_ms``, ``output_tokens``, ``finish_reason`` (PR ai-dynamo/dynamo#9543 [PR]);
      the decode-side span carries a **link** to the prefill-side span (test
      ``test_disagg_decode_span_links_to_prefill_span``).  Kind INTERNAL [I: no otel.kind known].
    * engine-internal spans (e.g. vLLM ``llm_request``) nest under ``engine.generate``
      [PR #9543]; not built here.

    Aggregated: preprocess -> route -> one worker (prefill+decode).  Disaggregated: a
    ``router.route_request`` hop to the prefill worker, then one to the decode worker; the
    KV transfer happens inside the decode worker before its first token [I].  Times are
    seconds; ``ttft_ms`` is **milliseconds**.  Counts as ONE request.
    """
    trace = trace_id(seed)
    root_sid = span_id(seed + ":http-request")
    ttft = preprocess_s + route_s + prefill_s + (kv_transfer_s + route_s if disaggregated else 0)
    e2e = ttft + decode_s + 0.001
    rs_list = []
    front_spans = []
    if not disaggregated:
        r_sid = span_id(seed + ":route")
        w_start = preprocess_s + route_s
        worker, _ = _dynamo_worker(trace, r_sid, seed + ":agg", t0_ns, w_start, e2e - 0.0005,
                                   "agg", model, input_tokens, output_tokens,
                                   (prefill_s) * 1000.0, "stop", 7001, "backend")
        rs_list.append(worker)
        front_spans.append(make_span(
            "router.route_request", trace=trace, sid=r_sid, parent=root_sid, kind=CLIENT,
            start_ns=ns(t0_ns, preprocess_s), end_ns=ns(t0_ns, e2e - 0.0002),
            attrs={"request.attempt": "0", "migration.is_retry": "false",
                   "request.outcome": outcome}))
        workers = {"prefill_worker_id": None, "decode_worker_id": None}
    else:
        p_sid = span_id(seed + ":route-prefill")
        d_sid = span_id(seed + ":route-decode")
        p_start = preprocess_s + route_s
        p_end = p_start + prefill_s
        d_start = p_end + route_s
        pw, p_eg = _dynamo_worker(trace, p_sid, seed + ":prefill", t0_ns, p_start, p_end,
                                  "prefill", model, input_tokens, 1, prefill_s * 1000.0,
                                  "length", 7001, "prefill")
        dw, _ = _dynamo_worker(trace, d_sid, seed + ":decode", t0_ns, d_start, e2e - 0.0005,
                               "decode", model, input_tokens, output_tokens,
                               (kv_transfer_s + 0.0005) * 1000.0, "stop", 7002, "decode",
                               links=[(trace, p_eg)])
        rs_list += [pw, dw]
        for sid, s, e in ((p_sid, preprocess_s, p_end + 0.0001), (d_sid, p_end, e2e - 0.0002)):
            front_spans.append(make_span(
                "router.route_request", trace=trace, sid=sid, parent=root_sid, kind=CLIENT,
                start_ns=ns(t0_ns, s), end_ns=ns(t0_ns, e),
                attrs={"request.attempt": "0", "migration.is_retry": "false",
                       "request.outcome": outcome}))
        workers = {"prefill_worker_id": 7001, "decode_worker_id": 7002}
    root_attrs = {"method": "POST", "uri": "/v1/chat/completions", "version": "HTTP/1.1",
                  "trace_flags": "01", "x_request_id": "req-abc", "request_id": "7c1e0d2a-dyn",
                  "model": model, "request.outcome": outcome, "input_tokens": input_tokens,
                  "output_tokens": output_tokens, "ttft_ms": ttft * 1000.0,
                  "avg_itl_ms": decode_s / max(1, output_tokens - 1) * 1000.0, **workers}
    root = make_span("http-request", trace=trace, sid=root_sid, parent=None, kind=INTERNAL,
                     start_ns=t0_ns, end_ns=ns(t0_ns, e2e), attrs=root_attrs)
    front = resource_spans({"service.name": "dynamo-frontend"}, "dynamo", [root] + front_spans)
    return request(front, *rs_list)


# ---------------------------------------------------------------------------
# llm-d (EPP gateway + P/D routing sidecar)
# ---------------------------------------------------------------------------
def llmd_disaggregated(
    *,
    model: str = "meta-llama/Llama-3.1-8B-Instruct",
    connector: str = "nixlv2",
    epp_s: float = 0.004,
    prefill_s: float = 0.120,
    coordinator_s: float = 0.002,
    decode_s: float = 0.700,
    vllm_spans: bool = True,
    t0_ns: int = T0_NS,
    seed: str = "llmd",
) -> ExportTraceServiceRequest:
    """A P/D-disaggregated request through llm-d.

    llm-d/llm-d-router @ ``ebab687927f5331c1b39defcb579a07951bce56c``:

    * EPP (service ``llm-d-epp``, cmd/epp/runner/runner.go:241): ``gateway.request`` SERVER,
      re-parented to the inbound ``traceparent`` (pkg/epp/handlers/server.go:455-460, scope
      ``llm-d-router/pkg/epp/handlers``, server.go:278); child ``gateway.request_orchestration``
      SERVER with ``target_model`` (string) and ``request_prio`` (int)
      (pkg/epp/requestcontrol/director.go:241-266); scheduling children ``run_scheduler_profile``
      (pkg/epp/scheduling/scheduler.go:153), ``pick_pd_profile``
      (pkg/epp/framework/plugins/scheduling/profilehandler/disagg/pd_profile_handler.go:175) -
      shown; others exist (``filter_endpoints``, ``llm_d.epp.scoring``, ``pick_endpoints`` ...).
      The EPP injects ``traceparent`` into the headers it returns to Envoy
      (pkg/epp/handlers/request.go:127-138).
    * Sidecar (service ``llm-d-disagg-sidecar``, cmd/pd-sidecar/main.go:58): otelhttp server
      span ``llm_d.pd_proxy.<METHOD> <path>`` (pkg/sidecar/proxy/proxy_helpers.go:41-49) ->
      ``forward_request`` SERVER (pkg/sidecar/proxy/chat_completions.go:61-113) with
      ``llm_d.pd_proxy.connector``, ``.kv_connector``, ``.ec_connector``, ``.request_path``,
      ``llm_d.openai.api``, ``llm_d.pd_proxy.disaggregation_used`` (bool),
      ``.prefill_target``, ``.prefill_candidates`` (int).
    * nixlv2 sequential (connector_nixlv2.go:84-96, 244-247, 296-304, 443-467): ``prefill``
      INTERNAL (``llm_d.pd_proxy.request_id``, ``.prefill_target``, ``.connector``, then
      ``llm_d.pd_proxy.prefill.status_code`` int, ``llm_d.pd_proxy.prefill.duration_ms``
      float); ``decode`` INTERNAL **started from the prefill span's context, so it is a child
      of ``prefill``** (``ctx, prefillSpan := tracer.Start(ctx, ...)`` then
      ``ctx, decodeSpan := tracer.Start(ctx, ...)``); ``decode`` gets
      ``llm_d.pd_proxy.decode.duration_ms`` and, via ``trace.SpanFromContext(ctx)`` = the decode
      span, ``llm_d.pd_proxy.total_duration_ms``, ``.true_ttft_ms``, ``.prefill_duration_ms``,
      ``.decode_duration_ms``, ``.coordinator_overhead_ms`` - all ``float64(Milliseconds())``,
      i.e. **whole milliseconds as doubles**.  ``true_ttft_ms`` = decode start - the sidecar
      handler's ``requestStart`` (chat_completions.go:64,71), NOT the first token and NOT the
      gateway start (despite the code comment).
    * mooncake / p2p / nixlv2-parallel use ``llm_d.pd_proxy.prefill`` / ``llm_d.pd_proxy.decode``
      instead (connector_mooncake.go:201,243; connector_p2p.go:134,175;
      connector_nixlv2.go:640,657).  ``connector="mooncake"`` switches names.
    * Outbound calls go through ``otelhttp.NewTransport`` (proxy.go:539-565), which adds a
      CLIENT span per call (name ``HTTP POST`` = otelhttp v0.68 default, UNVERIFIED); the
      prefill / decode vLLM ``llm_request`` spans are its children.
    Counts as ONE request; its KV transfer is inside the decode vLLM's prefill/queue time (no
    span of its own in llm-d).
    """
    trace = trace_id(seed)
    sid = lambda s: span_id(f"{seed}:{s}")  # noqa: E731
    sp = lambda name, key, parent, kind, s, e, attrs=None: make_span(  # noqa: E731
        name, trace=trace, sid=sid(key), parent=parent, kind=kind, start_ns=ns(t0_ns, s),
        end_ns=ns(t0_ns, e), attrs=attrs)
    prefixed = connector != "nixlv2"
    p_name = "llm_d.pd_proxy.prefill" if prefixed else "prefill"
    d_name = "llm_d.pd_proxy.decode" if prefixed else "decode"
    side_start = epp_s + 0.0005
    p_start = side_start + 0.0003
    p_end = p_start + prefill_s
    d_start = p_end + coordinator_s
    d_end = d_start + decode_s
    end = d_end + 0.0005
    ms = lambda x: float(int(x * 1000))  # noqa: E731  (Go Duration.Milliseconds())
    epp = [
        sp("gateway.request", "gw", None, SERVER, 0.0, end + 0.0003),
        sp("gateway.request_orchestration", "orch", sid("gw"), SERVER, 0.0002, epp_s - 0.0002,
           {"target_model": model, "request_prio": 0}),
        sp("run_scheduler_profile", "prof", sid("orch"), INTERNAL, 0.0005, epp_s - 0.0015,
           {"llm_d.epp.scheduling.profile.name": "prefill"}),
        sp("pick_pd_profile", "pick", sid("orch"), INTERNAL, epp_s - 0.0014, epp_s - 0.0004),
    ]
    side = [
        sp("llm_d.pd_proxy.POST /v1/chat/completions", "otelhttp", sid("gw"), SERVER,
           side_start, end),
        sp("forward_request", "fwd", sid("otelhttp"), SERVER, side_start + 0.0001, end - 0.0001,
           {"llm_d.pd_proxy.connector": connector, "llm_d.pd_proxy.kv_connector": connector,
            "llm_d.pd_proxy.ec_connector": "", "llm_d.pd_proxy.request_path": "/v1/chat/completions",
            "llm_d.openai.api": "chat_completions", "llm_d.pd_proxy.disaggregation_used": True,
            "llm_d.pd_proxy.prefill_target": "10.0.0.12:8000", "llm_d.pd_proxy.prefill_candidates": 1}),
        sp(p_name, "prefill", sid("fwd"), INTERNAL, p_start, p_end,
           {"llm_d.pd_proxy.request_id": "3f2b-uuid", "llm_d.pd_proxy.prefill_target": "10.0.0.12:8000",
            "llm_d.pd_proxy.connector": connector, "llm_d.pd_proxy.prefill.status_code": 200,
            "llm_d.pd_proxy.prefill.duration_ms": ms(prefill_s)}),
        sp(d_name, "decode", sid("prefill") if not prefixed else sid("fwd"), INTERNAL, d_start, d_end,
           {"llm_d.pd_proxy.request_id": "3f2b-uuid", "llm_d.pd_proxy.connector": connector,
            "llm_d.pd_proxy.decode.duration_ms": ms(decode_s),
            "llm_d.pd_proxy.total_duration_ms": ms(d_end - (side_start + 0.0001)),
            "llm_d.pd_proxy.true_ttft_ms": ms(d_start - (side_start + 0.0001)),
            "llm_d.pd_proxy.prefill_duration_ms": ms(prefill_s),
            "llm_d.pd_proxy.decode_duration_ms": ms(decode_s),
            "llm_d.pd_proxy.coordinator_overhead_ms": ms(coordinator_s)}),
        sp("HTTP POST", "pclient", sid("prefill"), CLIENT, p_start + 0.0001, p_end - 0.0001),
        sp("HTTP POST", "dclient", sid("decode"), CLIENT, d_start + 0.0001, d_end - 0.0001),
    ]
    out = request(
        resource_spans({"service.name": "llm-d-epp"}, "llm-d-router/pkg/epp/handlers", epp),
        resource_spans({"service.name": "llm-d-disagg-sidecar"}, "llm-d-router/pkg/sidecar/proxy", side),
    )
    if vllm_spans:
        pv = vllm_request_span(model=model, span_name_style="llm_request", token_keys="old",
                               token_events=False, preprocess_s=0.002, queue_s=0.003,
                               prefill_s=prefill_s - 0.007, decode_steps=(), detokenize_s=0.001,
                               parent=(trace, sid("pclient")), t0_ns=ns(t0_ns, p_start + 0.0002),
                               seed=seed + ":vllm-prefill", finish_reasons=("length",))
        dv = vllm_request_span(model=model, span_name_style="llm_request", token_keys="old",
                               token_events=False, preprocess_s=0.002, queue_s=0.004,
                               prefill_s=0.010, decode_steps=((decode_s - 0.020) / 20,) * 20,
                               detokenize_s=0.001,
                               parent=(trace, sid("dclient")), t0_ns=ns(t0_ns, d_start + 0.0002),
                               seed=seed + ":vllm-decode")
        out.resource_spans.extend(pv.resource_spans)
        out.resource_spans.extend(dv.resource_spans)
    return out


# ---------------------------------------------------------------------------
# SGLang prefill/decode disaggregation (two roots in one trace)
# ---------------------------------------------------------------------------
SGLANG_PD_ROOM = 0x5A3C9E1D2B4F6071  # the router's bootstrap_room, shared by both servers


def sglang_pd_request(
    *,
    model: str = "qwen3-8b",
    room: int | None = SGLANG_PD_ROOM,
    tokenize_s: float = 0.0030,
    dispatch_s: float = 0.0004,
    prefill_prepare_s: float = 0.0008,
    prefill_bootstrap_s: float = 0.0060,
    prefill_waiting_s: float = 0.0250,
    prefill_forward_s: float = 0.0400,
    kv_transfer_s: float = 0.0090,
    decode_prepare_s: float = 0.0007,
    decode_bootstrap_s: float = 0.0050,
    decode_waiting_s: float = 0.0030,
    decode_steps: Sequence[float] = (0.011,) * 9,
    return_s: float = 0.0015,
    prompt_tokens: int = 420,
    cached_tokens: int = 128,
    prefill_rid: str = "9f2c4e1a77d04b0c8d61e3a5b2f0c9d1",
    decode_rid: str = "2b7e0d93c1a84f56a0e4d7c2b9f1a368",
    parent: tuple[bytes, bytes] | None = (bytes.fromhex("4bf92f3577b34da6a3ce929d0e0e4736"),
                                          bytes.fromhex("00f067aa0ba902b7")),
    t0_ns: int = T0_NS,
    seed: str = "sglang-pd",
) -> ExportTraceServiceRequest:
    """One request served by an SGLang prefill server and an SGLang decode server (PD disaggregation).

    From the sglang 0.5.23 wheel (paths under ``python/sglang/srt/``, lines of that wheel):

    * Each server's TokenizerManager makes its **own root** (``init_trace_ctx``,
      ``observability/req_time_stats.py:288-310``, ``role=self.disagg_mode_str()``, which is
      ``"prefill"`` / ``"decode"``, :260-268); ``trace_req_start`` names it ``f"{role} Req {rid[:8]}"``
      and puts ``rid``, ``module="sglang::request"`` and ``bootstrap_room=str(hex(room))`` on it
      (``observability/trace.py:546-579``, the attribute at :566-567). Its parent is the context
      extracted from the HTTP request's headers (``managers/tokenizer_manager.py:3805-3815``,
      ``trace.py:558-560``): when the router in front forwards the caller's ``traceparent`` to both
      servers, the two roots are **siblings in one trace** [I: the router's propagation is not in the
      wheel]. The ``rid`` is each server's own unless the caller set one, so the two roots are paired by
      ``bootstrap_room``: the request's own field, which the PD router sets to one value on both copies
      and each tokenizer passes to ``init_trace_ctx`` (``managers/tokenizer_manager.py:3816-3844``).
    * Thread spans: ``PrefillTokenizer`` / ``DecodeTokenizer`` (``entrypoints/http_server.py:325-330``),
      ``Prefill Scheduler`` / ``Decode Scheduler`` (``managers/scheduler.py:6352-6357``).
    * Prefill server stages: ``tokenize``, ``api_server_dispatch``, ``prefill_prepare`` (scheduler
      receipt → bootstrap queue, ``req_time_stats.py:1033-1039``), ``prefill_bootstrap`` (bootstrap
      queue → waiting queue: ``set_wait_queue_entry_time`` in PREFILL mode, :776-800),
      ``prefill_waiting`` (waiting queue → forward, :802-826), ``prefill_forward`` (→ prefill result,
      :854-882), ``prefill_transfer_kv_cache`` (KV transfer queue entry → KV sent, :1045-1053;
      ``disaggregation/prefill.py:1074,1235``). **That is the KV transfer SGLang marks.**
    * Decode server stages: ``tokenize``, ``api_server_dispatch``, ``decode_prepare`` (receipt →
      pre-allocation queue, :1055-1061), ``decode_bootstrap`` (→ transfer queue, :1063-1073),
      ``decode_transferred`` (transfer queue → waiting queue: it waits for the prefill server's queue,
      prefill and transfer, so it is no transfer time; PD branch of :776-800, ``disaggregation/decode.py:
      1875,2776``), ``decode_waiting`` (waiting queue → forward: the decode side's queue, :815-817),
      ``decode_forward`` (forward → completion, started at :819-824, ended by ``set_completion_time``
      :947-952) with a ``decode_loop`` per step under it.
    * The prefill server produces one token (finish reason ``length``, [I]); the decode server's root
      carries the answer's tokens, finish reason and latencies (attributes as in the unified capture,
      ``sglang/README.md``).

    Timeline (seconds from t0; both servers receive the request at t0): each tokenizes and dispatches;
    prefill: prepare, bootstrap, waiting, forward, KV transfer; decode: prepare, bootstrap, then
    ``decode_transferred`` until the KV has arrived (the prefill's transfer end), waiting, forward
    (``decode_steps``), ``return_s`` back to the tokenizer. Counts as ONE request.
    """
    trace = parent[0] if parent else trace_id(seed, bits64=True)
    sid = lambda key: span_id(f"{seed}:{key}")  # noqa: E731
    spans_p: list[Span] = []
    spans_d: list[Span] = []

    def sp(out: list[Span], name: str, key: str, parent_sid: bytes | None, start: float, end: float,
           attrs: Mapping[str, Any] | None = None, status: int = Status.StatusCode.STATUS_CODE_UNSET) -> None:
        out.append(make_span(name, trace=trace, sid=sid(key), parent=parent_sid, kind=INTERNAL,
                             start_ns=ns(t0_ns, start), end_ns=ns(t0_ns, end), attrs=attrs, status_code=status))

    tok_end = tokenize_s
    disp_end = tok_end + dispatch_s
    # prefill server
    p_prep_end = disp_end + prefill_prepare_s
    p_boot_end = p_prep_end + prefill_bootstrap_s
    p_wait_end = p_boot_end + prefill_waiting_s
    p_fwd_end = p_wait_end + prefill_forward_s
    kv_end = p_fwd_end + kv_transfer_s
    p_first = p_fwd_end + return_s  # the prefill tokenizer gets its one token
    p_finish = kv_end + return_s
    # decode server
    d_prep_end = disp_end + decode_prepare_s
    d_boot_end = d_prep_end + decode_bootstrap_s
    d_transferred_end = kv_end + 0.0002  # KV arrived: into the waiting queue
    d_wait_end = d_transferred_end + decode_waiting_s
    t = d_wait_end
    loops = []
    for i, step in enumerate(decode_steps):
        loops.append((i, t, t + step))
        t += step
    d_fwd_end = t
    d_first = loops[0][2] + return_s if loops else d_fwd_end + return_s
    d_finish = d_fwd_end + return_s
    completion = len(loops) + 1  # the first token came with the KV (SGLang's decode forward emits the rest)

    def root_attrs(rid: str) -> dict[str, Any]:
        out: dict[str, Any] = {"rid": rid, "module": "sglang::request"}
        if room is not None:
            out["bootstrap_room"] = str(hex(room))
        return out

    def finish_attrs(rid: str, tokens: int, reason: str, first: float, end: float) -> dict[str, Any]:
        return {"gen_ai.usage.completion_tokens": tokens, "gen_ai.usage.prompt_tokens": prompt_tokens,
                "gen_ai.usage.cached_tokens": cached_tokens if reason == "length" else 0,
                "gen_ai.request.id": rid, "gen_ai.request.max_tokens": 256, "gen_ai.response.model": model,
                "gen_ai.response.finish_reasons": json.dumps([reason]),
                "gen_ai.latency.time_to_first_token": first, "gen_ai.latency.e2e": end,
                "gen_ai.latency.time_in_model_decode": end - first,
                "gen_ai.latency.time_in_model_inference": end - disp_end,
                "gen_ai.latency.time_in_model_prefill": first - disp_end}

    parent_sid = parent[1] if parent else None
    host = "(host:5e1f0c0f | pid:{})"
    # --- prefill server
    sp(spans_p, f"prefill Req {prefill_rid[:8]}", "p-root", parent_sid, 0.0, p_finish,
       {**root_attrs(prefill_rid), **finish_attrs(prefill_rid, 1, "length", p_first, p_finish)})
    sp(spans_p, "PrefillTokenizer" + host.format(5101), "p-tok", sid("p-root"), 0.0, disp_end,
       {"host_id": "5e1f0c0ffee04b1d", "pid": 5101, "thread_label": "PrefillTokenizer"})
    sp(spans_p, "tokenize", "p-tokenize", sid("p-tok"), 0.0, tok_end)
    sp(spans_p, "api_server_dispatch", "p-dispatch", sid("p-tok"), tok_end, disp_end)
    sp(spans_p, "Prefill Scheduler [TP 0] " + host.format(5102), "p-sched", sid("p-root"), disp_end, kv_end,
       {"tp_rank": 0, "host_id": "5e1f0c0ffee04b1d", "pid": 5102, "thread_label": "Prefill Scheduler"})
    sp(spans_p, "prefill_prepare", "p-prepare", sid("p-sched"), disp_end, p_prep_end)
    sp(spans_p, "prefill_bootstrap", "p-bootstrap", sid("p-sched"), p_prep_end, p_boot_end)
    sp(spans_p, "prefill_waiting", "p-waiting", sid("p-sched"), p_boot_end, p_wait_end)
    sp(spans_p, "prefill_forward", "p-forward", sid("p-sched"), p_wait_end, p_fwd_end)
    sp(spans_p, "prefill_transfer_kv_cache", "p-kv", sid("p-sched"), p_fwd_end, kv_end)
    # --- decode server
    sp(spans_d, f"decode Req {decode_rid[:8]}", "d-root", parent_sid, 0.0, d_finish,
       {**root_attrs(decode_rid), **finish_attrs(decode_rid, completion, "stop", d_first, d_finish)})
    sp(spans_d, "DecodeTokenizer" + host.format(6101), "d-tok", sid("d-root"), 0.0, disp_end,
       {"host_id": "77aa01c2d3e4f5a6", "pid": 6101, "thread_label": "DecodeTokenizer"})
    sp(spans_d, "tokenize", "d-tokenize", sid("d-tok"), 0.0, tok_end)
    sp(spans_d, "api_server_dispatch", "d-dispatch", sid("d-tok"), tok_end, disp_end)
    sp(spans_d, "Decode Scheduler [TP 0] " + host.format(6102), "d-sched", sid("d-root"), disp_end, d_fwd_end,
       {"tp_rank": 0, "host_id": "77aa01c2d3e4f5a6", "pid": 6102, "thread_label": "Decode Scheduler"})
    sp(spans_d, "decode_prepare", "d-prepare", sid("d-sched"), disp_end, d_prep_end)
    sp(spans_d, "decode_bootstrap", "d-bootstrap", sid("d-sched"), d_prep_end, d_boot_end)
    sp(spans_d, "decode_transferred", "d-transferred", sid("d-sched"), d_boot_end, d_transferred_end)
    sp(spans_d, "decode_waiting", "d-waiting", sid("d-sched"), d_transferred_end, d_wait_end)
    sp(spans_d, "decode_forward", "d-forward", sid("d-sched"), d_wait_end, d_fwd_end)
    for i, start, end in loops:
        sp(spans_d, "decode_loop", f"d-loop-{i}", sid("d-forward"), start, end, {"decode_ct": i})
    resource = {"telemetry.sdk.language": "python", "telemetry.sdk.name": "opentelemetry"}
    return request(resource_spans({**resource, "service.name": "sglang-prefill"}, "sglang server", spans_p),
                   resource_spans({**resource, "service.name": "sglang-decode"}, "sglang server", spans_d))


# ---------------------------------------------------------------------------
# malformed / partial variants
# ---------------------------------------------------------------------------
def mutate(req: ExportTraceServiceRequest) -> ExportTraceServiceRequest:
    return copy.deepcopy(req)


def drop_events(req: ExportTraceServiceRequest, names: Iterable[str]) -> ExportTraceServiceRequest:
    """Remove every event with one of ``names`` (e.g. a missing QUEUE_START)."""
    out = mutate(req)
    names = set(names)
    for s in all_spans(out):
        keep = [e for e in s.events if e.name not in names]
        del s.events[:]
        s.events.extend(keep)
    return out


def shift_event(req: ExportTraceServiceRequest, name: str, delta_s: float,
                occurrence: int = 0) -> ExportTraceServiceRequest:
    """Move the ``occurrence``-th event ``name`` by ``delta_s`` (out-of-order variants)."""
    out = mutate(req)
    seen = 0
    for s in all_spans(out):
        for e in s.events:
            if e.name == name:
                if seen == occurrence:
                    e.time_unix_nano += int(round(delta_s * 1e9))
                    return out
                seen += 1
    raise KeyError(name)


def set_attr(req: ExportTraceServiceRequest, span_name: str, key: str, value: Any
             ) -> ExportTraceServiceRequest:
    """Set (or with ``value=None`` remove) an attribute on every span called ``span_name``."""
    out = mutate(req)
    for s in all_spans(out):
        if s.name != span_name:
            continue
        keep = [a for a in s.attributes if a.key != key]
        del s.attributes[:]
        s.attributes.extend(keep)
        if value is not None:
            s.attributes.append(KeyValue(key=key, value=any_value(value)))
    return out


def drop_spans(req: ExportTraceServiceRequest, names: Iterable[str]) -> ExportTraceServiceRequest:
    """Remove spans by name (e.g. a lost ``compute`` span or a missing worker span)."""
    out = mutate(req)
    names = set(names)
    for r in out.resource_spans:
        for ss in r.scope_spans:
            keep = [s for s in ss.spans if s.name not in names]
            del ss.spans[:]
            ss.spans.extend(keep)
    return out


MALFORMED_VARIANTS = {
    "triton_missing_queue_start": lambda: triton_request(missing_events=("QUEUE_START",)),
    "triton_missing_compute_end": lambda: triton_request(missing_events=("COMPUTE_END",)),
    "triton_missing_compute_span": lambda: drop_spans(triton_request(), ["compute"]),
    "triton_compute_before_queue": lambda: shift_event(triton_request(), "COMPUTE_START", -0.010),
    "triton_response_before_request": lambda: shift_event(
        triton_request(), "INFER_RESPONSE_COMPLETE", -0.100),
    "trtllm_ttft_not_measured": lambda: trtllm_serve_span(
        not_measured=("gen_ai.latency.time_to_first_token",)),
    "trtllm_all_not_measured": lambda: trtllm_serve_span(not_measured=(
        "gen_ai.latency.time_to_first_token", "gen_ai.latency.e2e",
        "gen_ai.latency.time_in_queue", "gen_ai.latency.kv_cache_transfer_time")),
    "vllm_token_events_out_of_order": lambda: shift_event(
        vllm_request_span(), "token_generated", 0.5, occurrence=1),
    "vllm_missing_first_token_event": lambda: drop_events(vllm_request_span(), ["token_generated"]),
    "vllm_negative_queue": lambda: set_attr(vllm_request_span(), "chat Qwen/Qwen3-0.6B",
                                            "gen_ai.latency.time_in_queue", -0.01),
    "dynamo_negative_ttft": lambda: set_attr(dynamo_request(), "http-request", "ttft_ms", -1.0),
    "dynamo_missing_worker": lambda: drop_spans(dynamo_request(disaggregated=True),
                                                ["handle_payload"]),
    "llmd_missing_decode": lambda: drop_spans(llmd_disaggregated(), ["decode"]),
}

BUILDERS = {
    "vllm_request_span": vllm_request_span,
    "triton_request": triton_request,
    "triton_ensemble": triton_ensemble,
    "triton_bls": triton_bls,
    "trtllm_serve_span": trtllm_serve_span,
    "trtllm_serve_disaggregated": trtllm_serve_disaggregated,
    "dynamo_request": dynamo_request,
    "llmd_disaggregated": llmd_disaggregated,
    "sglang_pd_request": sglang_pd_request,
}
